#include "base/random_bytes.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"

namespace optstep {

void FillRandomBytes(void* data, size_t size) {
  char* const bytes = static_cast<char*>(data);
  size_t filled = 0;
  while (filled < size) {
    const ssize_t n = getrandom(bytes + filled, size - filled, 0);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
  }
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  FillRandomBytes(raw.data(), raw.size());
  return absl::BytesToHexString(raw);
}

}  // namespace optstep
