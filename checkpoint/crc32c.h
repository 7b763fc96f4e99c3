#ifndef OPTSTEP_CHECKPOINT_CRC32C_H_
#define OPTSTEP_CHECKPOINT_CRC32C_H_

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF),
// the checksum of checkpoint shard files. Uses the SSE4.2 `crc32` instruction where the build
// targets it (the project builds for x86-64-v2) and a table-driven loop elsewhere; both give the
// same values. Stateless, thread-safe.

#include <cstddef>
#include <cstdint>

namespace optstep {

// CRC-32C of `n` bytes at `data`, continuing from `crc` (the value of the bytes before; 0 for
// none): Crc32cExtend(Crc32cExtend(0, a, n), b, m) == CRC-32C of a followed by b.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

namespace internal {
// The table-driven implementation, exposed so that tests compare both paths.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_CRC32C_H_
