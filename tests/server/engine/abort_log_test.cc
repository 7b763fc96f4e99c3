// The lines a step's abort writes are lines a caller can cause: a tenant whose trainers leave step
// after step incomplete must not fill the rank's disk with them, so they are taken from the
// callers' log budget (base/log_budget.h), as the lines of failed calls are.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/log_budget.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/log_lines.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::LogLines;
using ::testing::Contains;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;

// A session's step begun by one of its two trainers and left incomplete past its deadline:
// answers the lines logged meanwhile.
std::vector<std::string> LinesOfAnAbort(Engine& engine) {
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.num_trainers = 2;
  config.step_deadline = absl::Seconds(3);
  std::shared_ptr<Session> session = testutil::MakeSession(engine, config);
  EXPECT_NE(session, nullptr);
  if (session == nullptr) return {};
  LogLines lines;
  (void)testutil::BeginStep(*session, 1, 0);
  session->AbortIfExpired(absl::Now() + absl::Hours(1));
  return lines.lines();
}

// Before, each abort wrote its line whatever the budget.
TEST(AbortLogTest, AnAbortsLineIsTakenFromTheCallersLogBudget) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  LogBudget room(/*per_second=*/0, /*burst=*/10);
  {
    ScopedCallerLogBudget budget(&room);
    EXPECT_THAT(LinesOfAnAbort(*engine), Contains(HasSubstr("voting to abort")));
  }
  LogBudget spent(/*per_second=*/0, /*burst=*/0);
  ScopedCallerLogBudget budget(&spent);
  EXPECT_THAT(LinesOfAnAbort(*engine), Each(Not(HasSubstr("voting to abort"))));
}

}  // namespace
}  // namespace optstep
