// HealEndWatch with the time passed in: a rank misses a heal's end only while it runs the heal,
// once rank 0's answers have said for longer than the bound, in a row, that rank 0 ended it or
// began a later one; a rank 0 behind the heal (a process yet to heal itself in) or still in it
// says nothing of the kind, and a new heal or the end starts the watch again.

#include "server/rpc/heal_end_watch.h"

#include <optional>

#include "gtest/gtest.h"

namespace optstep {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);
const absl::Duration kBound = absl::Seconds(1);

TEST(HealEndWatchTest, ARankInNoHealMissesNothing) {
  HealEndWatch watch(kBound);
  watch.HeardRankZero(3, /*healing=*/false, kStart);
  EXPECT_EQ(watch.Missed(kStart + absl::Hours(1)), std::nullopt);
}

TEST(HealEndWatchTest, RankZeroStillHealingIsNoMissedEnd) {
  HealEndWatch watch(kBound);
  watch.Began(2);
  for (int i = 0; i < 30; ++i) {
    watch.HeardRankZero(2, /*healing=*/true, kStart + i * absl::Milliseconds(100));
  }
  EXPECT_EQ(watch.Missed(kStart + absl::Hours(1)), std::nullopt);
}

TEST(HealEndWatchTest, AHealRankZeroEndedIsMissedAfterTheBound) {
  HealEndWatch watch(kBound);
  watch.Began(2);
  watch.HeardRankZero(2, /*healing=*/false, kStart);
  watch.HeardRankZero(2, /*healing=*/false, kStart + absl::Milliseconds(500));
  // Within the bound rank 0's call that ends the heal here may still be on its way.
  EXPECT_EQ(watch.Missed(kStart + kBound), std::nullopt);
  EXPECT_EQ(watch.Missed(kStart + kBound + absl::Milliseconds(1)), 2u);
}

TEST(HealEndWatchTest, ALaterHealOfRankZeroMeansTheEndWasMissed) {
  HealEndWatch watch(kBound);
  watch.Began(2);
  watch.HeardRankZero(3, /*healing=*/true, kStart);
  EXPECT_EQ(watch.Missed(kStart + 2 * kBound), 2u);
}

TEST(HealEndWatchTest, ARankZeroBehindTheHealSaysNothing) {
  // A restarted rank 0 answers at generation 0 until it healed itself into the survivors' group.
  HealEndWatch watch(kBound);
  watch.Began(4);
  watch.HeardRankZero(0, /*healing=*/false, kStart);
  EXPECT_EQ(watch.Missed(kStart + absl::Hours(1)), std::nullopt);
}

TEST(HealEndWatchTest, OneAnswerOfAHealingRankZeroStartsTheWaitAgain) {
  HealEndWatch watch(kBound);
  watch.Began(2);
  watch.HeardRankZero(2, /*healing=*/false, kStart);
  watch.HeardRankZero(2, /*healing=*/true, kStart + absl::Milliseconds(900));
  watch.HeardRankZero(2, /*healing=*/false, kStart + absl::Milliseconds(1000));
  EXPECT_EQ(watch.Missed(kStart + absl::Milliseconds(1500)), std::nullopt);
  EXPECT_EQ(watch.Missed(kStart + absl::Milliseconds(2001)), 2u);
}

TEST(HealEndWatchTest, TheHealsEndOrANewHealStartsTheWatchAgain) {
  HealEndWatch watch(kBound);
  watch.Began(2);
  watch.HeardRankZero(2, /*healing=*/false, kStart);
  watch.Ended();
  EXPECT_EQ(watch.Missed(kStart + absl::Hours(1)), std::nullopt);

  watch.Began(3);
  watch.HeardRankZero(3, /*healing=*/false, kStart);
  watch.Began(4);  // the next heal's begin came: its end may come too
  EXPECT_EQ(watch.Missed(kStart + absl::Hours(1)), std::nullopt);
}

}  // namespace
}  // namespace optstep
