// The shadows fetched again after a state import (server/rpc/held_operations.cc, RefreshShadow):
// the import aborts the pending step, and a trainer may begin the next one before the refresh
// reaches its rank. The refresh must still be taken, since only the coordinator touches the
// shadow and no step resolves meanwhile. Before, it was refused ("step N is pending") and only
// logged: the shadow stayed stale, and the next loss of a rank was not healed but restarted the
// group. Ranks are engines in this process joined by gloo (RedundancyGroup).

#include <vector>

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

TEST(ShadowRefreshTest, ATrainerThatBeganTheNextStepDoesNotKeepTheShadowStale) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  const StateDict at_one[2] = {group.HeldExport(0), group.HeldExport(1)};
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  for (int r = 0; r < 2; ++r) ASSERT_THAT(group.HeldImport(r, at_one[r]), IsOk());

  // Trainer 0 begins step 2 again on rank 1 and sends one gradient before the refresh.
  Session& s = group.session(1);
  StepBegin begin;
  begin.step = 2;
  begin.return_params = false;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const StepHandle c, s.Begin(begin));
  int owned = 0;
  while (s.layout().owner[owned] != 1) ++owned;
  std::vector<float> grad(config.params[owned].numel());
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = RedundancyGroup::Gradient(2, owned, i);
  ASSERT_THAT(testutil::SendGradient(s, c, owned, 0, grad), IsOk());

  EXPECT_THAT(group.ImportShadow(1, group.OwnedState(0)), IsOk());
  EXPECT_EQ(Difference(group.Shadow(1), group.OwnedState(0)), "");
}

}  // namespace
}  // namespace optstep
