// LogBudget: a burst of lines goes out, then as many a second as the rate allows; the lines
// dropped meanwhile are counted and told to the next line that goes out.

#include "base/log_budget.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(LogBudgetTest, ABurstThenTheRateAndTheDroppedAreCounted) {
  absl::Time now = absl::FromUnixSeconds(1000);
  LogBudget budget(/*per_second=*/2, /*burst=*/3, [&] { return now; });
  int64_t dropped = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(budget.Take(&dropped));
    EXPECT_EQ(dropped, 0);
  }
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(budget.Take(&dropped));
  now += absl::Milliseconds(500);  // one line's worth
  EXPECT_TRUE(budget.Take(&dropped));
  EXPECT_EQ(dropped, 5);
  EXPECT_FALSE(budget.Take(&dropped));
  now += absl::Hours(1);  // refills to the burst, not beyond
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.Take(nullptr));
  EXPECT_FALSE(budget.Take(nullptr));
  now += absl::Seconds(1);
  EXPECT_TRUE(budget.Take(&dropped));
  EXPECT_EQ(dropped, 1);
}

}  // namespace
}  // namespace optstep
