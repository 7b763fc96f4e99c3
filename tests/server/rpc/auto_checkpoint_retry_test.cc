// The wait between attempts at an automatic checkpoint that keeps failing (a full or broken
// disk): a second after the first failure, doubling with each further one, at most a minute.

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/rpc/auto_checkpoint.h"

namespace optstep {
namespace {

TEST(RetryDelayTest, DoublesWithEachFailureInARowUpToTheMost) {
  const absl::Duration first = absl::Seconds(1);
  const absl::Duration most = absl::Minutes(1);
  EXPECT_EQ(RetryDelay(first, most, 1), absl::Seconds(1));
  EXPECT_EQ(RetryDelay(first, most, 2), absl::Seconds(2));
  EXPECT_EQ(RetryDelay(first, most, 3), absl::Seconds(4));
  EXPECT_EQ(RetryDelay(first, most, 6), absl::Seconds(32));
  EXPECT_EQ(RetryDelay(first, most, 7), most);
  EXPECT_EQ(RetryDelay(first, most, 1000000), most);  // no overflow after days of failures
  EXPECT_EQ(RetryDelay(absl::Seconds(90), most, 1), most);
}

}  // namespace
}  // namespace optstep
