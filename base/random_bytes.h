#ifndef OPTSTEP_BASE_RANDOM_BYTES_H_
#define OPTSTEP_BASE_RANDOM_BYTES_H_

// Bytes from the kernel's CSPRNG (getrandom), for what must be neither guessed nor repeated
// across processes: session ids, shared-memory tokens, request ids. Thread-safe.

#include <cstddef>
#include <string>

namespace optstep {

// Fills `size` bytes at `data`. Blocks until the CSPRNG is seeded; retries an interrupted call;
// aborts the process on a kernel without getrandom, where no such value can be made.
void FillRandomBytes(void* data, size_t size);

// `bytes` random bytes as 2 * `bytes` lower-case hex digits.
std::string RandomHex(size_t bytes);

}  // namespace optstep

#endif  // OPTSTEP_BASE_RANDOM_BYTES_H_
