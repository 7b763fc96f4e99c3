// ServerMetrics' log lines: the lines of steps applied or skipped have a budget of their own.

#include "server/rpc/metrics.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/testing/log_lines.h"

namespace optstep {
namespace {

int CountWith(const testutil::LogLines& log, const std::string& text) {
  int n = 0;
  for (const std::string& line : log.lines()) n += absl::StrContains(line, text) ? 1 : 0;
  return n;
}

// A tenant stepping a tiny session as fast as it can: its applied steps' lines stop at the
// budget (20 a second, bursts of 200), and the next one written tells how many were dropped.
// Before, every step wrote a line on every rank, outside any budget. Failures' lines keep the
// callers' budget of their own.
TEST(ServerMetricsTest, TheLinesOfAppliedStepsHaveABudget) {
  ServerMetrics metrics;
  testutil::LogLines log;
  constexpr int kSteps = 2000;
  for (int step = 1; step <= kSteps; ++step) {
    metrics.OnStepEnd("s", step, 0, StepObserver::StepEnd::kApplied, "");
  }
  const int written = CountWith(log, "event=step_applied");
  EXPECT_GE(written, 200);
  EXPECT_LT(written, kSteps / 2) << "the applied steps' lines were not bounded";
  metrics.OnStepEnd("s", kSteps + 1, 0, StepObserver::StepEnd::kAborted, "deadline");
  EXPECT_EQ(CountWith(log, "event=step_aborted"), 1);
}

}  // namespace
}  // namespace optstep
