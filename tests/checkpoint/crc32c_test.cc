#include "checkpoint/crc32c.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(Crc32cTest, KnownValues) {
  // The CRC-32C check value (RFC 3720 appendix B.4 and the Rocksoft catalogue).
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
}

TEST(Crc32cTest, HardwarePathMatchesTableAndExtends) {
  std::mt19937 rng(5);
  std::string data(10'000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 9999}) {
    EXPECT_EQ(Crc32c(data.data(), n), internal::Crc32cPortable(0, data.data(), n)) << n;
  }
  for (size_t split : {0, 3, 8, 4097, 10'000}) {
    const uint32_t first = Crc32c(data.data(), split);
    EXPECT_EQ(Crc32cExtend(first, data.data() + split, data.size() - split),
              Crc32c(data.data(), data.size()))
        << split;
  }
}

}  // namespace
}  // namespace optstep
