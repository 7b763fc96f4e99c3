// A replica made by a heal (CreateReplicaHere with the group's resolutions) on the rank that runs
// the heal waits for the heal's end, as the other ranks' replicas do (Session::PauseForHeal):
// before, it was never paused, and a resolution could start on it before the heal ended (an abort
// vote relayed meanwhile), on the connections the heal was still rebuilding. A replica of a session
// that had no resolution yet was left unpaused after that, and one that had was paused only after
// it could be reached: each is now paused before the engine registers it.

#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/rpc/heal.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;

constexpr uint64_t kGeneration = 3;

// A replica of one 4-element Adam parameter, one trainer, healed in after the group's
// `resolutions`.
v1::CreateReplicaRequest HealedReplica(uint64_t resolutions) {
  v1::CreateReplicaRequest request;
  request.set_session_id("s-healed");
  v1::SessionSpec* spec = request.mutable_spec();
  spec->set_name("healed");
  v1::ParameterSpec* w = spec->add_parameters();
  w->set_name("w");
  w->add_shape(4);
  spec->set_num_trainers(1);
  spec->set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec->mutable_optimizer()->set_preset("adam");
  request.set_resolutions(resolutions);
  return request;
}

class HealReplicaTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(HealReplicaTest, AReplicaMadeByARunningHealWaitsForItsEnd) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(EngineOptions());
  ASSERT_THAT(engine.status(), IsOk());
  ASSERT_THAT(CreateReplicaHere(engine->get(), HealedReplica(GetParam()), kGeneration), IsOk());
  absl::StatusOr<std::shared_ptr<Session>> session = (*engine)->GetSession("s-healed");
  ASSERT_THAT(session.status(), IsOk());
  StepBegin begin;
  begin.step = 1;
  begin.return_params = false;
  absl::StatusOr<StepHandle> c = (*session)->Begin(begin);
  ASSERT_THAT(c.status(), IsOk());
  const std::vector<float> gradient = {1, 2, 3, 4};
  ASSERT_THAT((*session)->AddGradient(*c, 0, 0, DType::kF32, gradient.data(), 16), IsOk());
  absl::Notification stepped;
  absl::StatusOr<StepOutcome> outcome = absl::UnknownError("not told");
  ASSERT_THAT((*session)->Commit(*c, 4,
                                 [&](absl::StatusOr<StepOutcome> told) {
                                   outcome = std::move(told);
                                   stepped.Notify();
                                 }),
              IsOk());
  EXPECT_FALSE(stepped.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
      << "the step resolved on the replica before the heal ended";
  (*session)->ResumeAfterHeal(kGeneration);
  ASSERT_TRUE(stepped.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_THAT(outcome.status(), IsOk());
}

// No resolution yet (the session's first step not resolved when the rank was lost), and five.
INSTANTIATE_TEST_SUITE_P(Resolutions, HealReplicaTest, ::testing::Values(0, 5));

}  // namespace
}  // namespace optstep
