// A rank killed inside a step's all-gather can leave the survivors apart: the ring all-gather
// completes on a rank that had every block and fails on one whose send to the dying rank broke.
// Here, on a real 3-rank group on loopback, one rank kills itself in step 3 of a session once the
// all-gather completed on it (--kill_after_allgather) and another answers that all-gather as
// failed (--fail_allgather_after): the third finished step 3 and answered it, the failing one is
// interrupted in it. The dead rank, restarted, heals in (rank 0 coordinating, or healing itself
// in when it is the one); the interrupted rank takes step 3 from one that finished it (the heal's
// catch-up, heal.h); the trainer, which sees step 3 applied, goes on without a rollback, and the
// run ends bit for bit with an undisturbed session, every survivor still the process it started
// as. And a trainer never has a step that a rank did not finish: a rank whose all-gather fails
// after its stream sent every parameter fails the trainer's step too (StreamEndTest).

#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/integration/healing_group.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitHealth;
using ::optstep::testutil::AwaitListedStep;
using ::optstep::testutil::Group;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Restart;
using ::optstep::testutil::Running;
using ::optstep::testutil::SameResolutionsEverywhere;
using ::optstep::testutil::SameStateAndParameters;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::SpreadSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::SteppedReference;
using ::optstep::testutil::StepSpread;
using ::optstep::testutil::Trainer;

constexpr int kWorld = 3;
const std::vector<std::string> kFlags = testutil::HealingFlags();

struct Split {
  int dead;    // killed once its all-gather completed
  int behind;  // its all-gather answered as failed
};

class SplitStepTest : public ::testing::TestWithParam<Split> {};

TEST_P(SplitStepTest, ASurvivorWhoseAllGatherFailedTakesTheStepAnotherFinished) {
  const int dead = GetParam().dead;
  const int behind = GetParam().behind;
  constexpr uint64_t kSteps = 5;
  constexpr uint64_t kCutStep = 3;
  // The all-gather of step kCutStep of the second session, after the first session's kSteps.
  const uint64_t cut = kSteps + kCutStep;
  const auto flags_of = [&](int r) {
    std::vector<std::string> flags = kFlags;
    if (r == behind) flags.push_back(absl::StrCat("--fail_allgather_after=", cut));
    if (r == dead) flags.push_back(absl::StrCat("--kill_after_allgather=", cut));
    return flags;
  };
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroupWith(kWorld, flags_of));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, kSteps));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo split, trainer->CreateSession(SpreadSpec("split")));
  for (uint64_t step = 1; step < kCutStep; ++step) {
    ASSERT_THAT(StepSpread(*trainer, split.session_id(), step).status(), IsOk());
  }
  absl::StatusOr<StepReply> stepped = absl::UnknownError("not run");
  std::thread step([&] { stepped = StepSpread(*trainer, split.session_id(), kCutStep); });
  const int status = group[dead]->Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  // The split: the third rank finished the step, the one behind did not.
  const int finished = 3 - dead - behind;
  absl::StatusOr<uint64_t> at =
      AwaitListedStep(*group[finished], split.session_id(), kCutStep, absl::Seconds(10));
  ASSERT_THAT(at.status(), IsOk());
  EXPECT_EQ(*at, kCutStep) << "rank " << finished;
  at = AwaitListedStep(*group[behind], split.session_id(), kCutStep - 1, absl::Seconds(1));
  ASSERT_THAT(at.status(), IsOk());
  EXPECT_EQ(*at, kCutStep - 1) << "rank " << behind;
  ASSERT_THAT(Restart(group, dead, kFlags), IsOk());
  step.join();
  // Applied, not rolled back: the trainer gets step kCutStep's parameters.
  ASSERT_THAT(stepped.status(), IsOk());
  EXPECT_EQ(stepped->step, kCutStep);
  for (uint64_t s = kCutStep + 1; s <= kSteps; ++s) {
    ASSERT_THAT(StepSpread(*trainer, split.session_id(), s).status(), IsOk()) << "step " << s;
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), split.session_id()), IsOk());
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

// A trainer has a step only once every rank ended it. Here rank 1 owns one AdamW vector of
// exactly one stream bucket (16 MiB), published as soon as it is stepped, and rank 0 a Muon
// matrix whose Newton–Schulz iterations keep rank 1 waiting in the all-gather meanwhile; rank 1
// then answers its all-gather as failed (--fail_allgather_after; no redundant state: its session
// breaks). The trainer's step fails with it, where it used to succeed: rank 1's stream had sent
// every parameter, and ended, before the all-gather.
TEST(StreamEndTest, ATrainerDoesNotHaveAStepARankFailedInItsAllGather) {
  const std::vector<std::string> flags = {"--state_redundancy=0", "--metrics_port=-1"};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroupWith(2, [&](int r) {
                                 std::vector<std::string> mine = flags;
                                 if (r == 1) mine.push_back("--fail_allgather_after=1");
                                 return mine;
                               }));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  ClientOptions client_options;
  for (const auto& rank : group) client_options.rank_targets.push_back(rank->address());
  client_options.recovery_timeout = absl::ZeroDuration();  // the step's own error, at once
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> trainer, Client::Connect(client_options));
  constexpr int kMatrix = 768;
  constexpr int kVector = 4 << 20;  // 16 MiB of fp32: one stream bucket
  v1::SessionSpec spec = SmallSpec("cut");
  spec.clear_parameters();
  auto* matrix = spec.add_parameters();
  matrix->set_name("hidden.weight");
  matrix->add_shape(kMatrix);
  matrix->add_shape(kMatrix);
  spec.add_parameters()->set_name("big.bias");
  spec.mutable_parameters(1)->add_shape(kVector);
  spec.mutable_optimizer()->set_preset("muon");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(spec));
  ASSERT_EQ(info.layout().owner(0), 0u);
  ASSERT_EQ(info.layout().owner(1), 1u);
  StepOptions options;
  options.session_id = info.session_id();
  options.step = 1;
  absl::StatusOr<StepReply> stepped = trainer->Step(
      options,
      {{0, std::vector<float>(kMatrix * kMatrix, 0.01f)}, {1, std::vector<float>(kVector, 0.01f)}});
  EXPECT_THAT(stepped.status(), StatusIs(absl::StatusCode::kUnavailable, "all-gather"));
}

INSTANTIATE_TEST_SUITE_P(Ranks, SplitStepTest, ::testing::Values(Split{2, 1}, Split{0, 2}),
                         [](const ::testing::TestParamInfo<Split>& info) {
                           return absl::StrCat("Rank", info.param.dead, "Dies_Rank",
                                               info.param.behind, "Behind");
                         });

}  // namespace
}  // namespace optstep
