// RandomHex and FillRandomBytes: the length asked for, hex digits, and values that do not repeat.

#include "base/random_bytes.h"

#include <cstdint>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

using ::testing::MatchesRegex;

TEST(RandomBytesTest, RandomHexHasTwoDigitsPerByteAndDoesNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string hex = RandomHex(16);
    EXPECT_THAT(hex, MatchesRegex("[0-9a-f]{32}"));
    seen.insert(hex);
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(RandomHex(0), "");
}

TEST(RandomBytesTest, FillRandomBytesFillsEveryByte) {
  // 64 KiB in one call (getrandom answers at most 32 MiB - 1 at once, and may answer less):
  // every byte value shows up, which a fill that stopped early would not give.
  std::string bytes(1 << 16, '\0');
  FillRandomBytes(bytes.data(), bytes.size());
  std::set<uint8_t> values(bytes.begin(), bytes.end());
  EXPECT_EQ(values.size(), 256u);
  // The last kilobyte alone is not all zeros either.
  EXPECT_NE(bytes.substr(bytes.size() - 1024), std::string(1024, '\0'));
}

}  // namespace
}  // namespace optstep
