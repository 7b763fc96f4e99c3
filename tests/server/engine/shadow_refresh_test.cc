// The shadows fetched again after a state import (server/rpc/held_operations.cc, RefreshShadow):
// the import aborts the pending step, and a trainer may begin the next one before the refresh
// reaches its rank. The refresh must still be taken, since only the coordinator touches the
// shadow, and the step must go on: a trainer that begins while the refresh is written is not
// taken for a retry of a step that resolves. Ranks are engines in this process joined by gloo
// (RedundancyGroup).

#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::Difference;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::RedundancyGroup;

// Begins step `step` as trainer 0 on rank r of `group` and sends the gradients of the parameters
// that rank owns (all of them, or the first only).
StepHandle BeginAndSend(RedundancyGroup& group, int r, uint64_t step, bool all) {
  Session& s = group.session(r);
  StepBegin begin;
  begin.step = step;
  begin.return_params = false;
  absl::StatusOr<StepHandle> c = s.Begin(begin);
  EXPECT_THAT(c.status(), IsOk());
  if (!c.ok()) return StepHandle();
  for (int p = 0; p < static_cast<int>(s.config().params.size()); ++p) {
    if (s.layout().owner[p] != r) continue;
    std::vector<float> grad(s.config().params[p].numel());
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = RedundancyGroup::Gradient(step, p, i);
    EXPECT_THAT(testutil::SendGradient(s, *c, p, 0, grad), IsOk());
    if (!all) break;
  }
  return *c;
}

// Before, the refresh was refused ("step N is pending") and only logged: the shadow stayed
// stale, and the next loss of a rank restarted the group instead of healing it.
TEST(ShadowRefreshTest, ATrainerThatBeganTheNextStepDoesNotKeepTheShadowStale) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  const StateDict at_one[2] = {group.HeldExport(0), group.HeldExport(1)};
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  for (int r = 0; r < 2; ++r) ASSERT_THAT(group.HeldImport(r, at_one[r]), IsOk());
  BeginAndSend(group, 1, 2, /*all=*/false);
  EXPECT_THAT(group.ImportShadow(1, group.OwnedState(0)), IsOk());
  EXPECT_EQ(Difference(group.Shadow(1), group.OwnedState(0)), "");
}

// A trainer that begins the step while the refresh is written (the rank's device slowed) steps
// with the others. A first version marked the session as resolving during the refresh: the
// Begin was taken for a retry, its gradients were not counted, and the step waited for its
// deadline.
TEST(ShadowRefreshTest, ATrainerThatBeginsWhileTheRefreshIsWrittenSteps) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  const StateDict shadow = group.OwnedState(0);
  testutil::FaultInjector& faults = group.device_faults(1);
  const int64_t base = faults.calls("CopyFromHost");
  faults.DelayCalls("CopyFromHost", base + 1, base + 1, absl::Seconds(1));
  absl::Notification refreshed;
  absl::Status refresh = absl::UnknownError("not done");
  group.session(1).ImportShadow(std::make_shared<const StateDict>(shadow), [&](absl::Status s) {
    refresh = s;
    refreshed.Notify();
  });
  // The refresh's first copy is under way (counted before its delay), and this thread makes
  // none until then: the trainer begins while the refresh is written.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (faults.calls("CopyFromHost") == base && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(faults.calls("CopyFromHost"), base + 1);
  testutil::Outcome outcomes[2];
  const StepHandle on_one = BeginAndSend(group, 1, 2, /*all=*/true);
  ASSERT_THAT(group.session(1).Commit(on_one, 0, outcomes[1].Callback()), IsOk());
  refreshed.WaitForNotification();
  EXPECT_THAT(refresh, IsOk());
  // Rank 0 only now, so that its collectives do not wait out their timeout for rank 1's slowed
  // coordinator.
  const StepHandle on_zero = BeginAndSend(group, 0, 2, /*all=*/true);
  ASSERT_THAT(group.session(0).Commit(on_zero, 0, outcomes[0].Callback()), IsOk());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(outcomes[r].WaitFor(absl::Seconds(20))) << "rank " << r << "'s step waits";
    EXPECT_THAT(outcomes[r].result().status(), IsOk());
  }
}

}  // namespace
}  // namespace optstep
