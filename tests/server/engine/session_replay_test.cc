// A step sent again is answered as a replay (applied) or a retry (committed) only for the same
// contribution: the same gradient bytes, however chunked, and the same schedule. A different one
// is FAILED_PRECONDITION and changes nothing (docs/design.md §3, docs/security.md). Its chunks
// are bounded as a first send's are.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BeginStep;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::ParamValues;
using ::optstep::testutil::SendGradient;
using ::optstep::testutil::StatusIs;
using ::testing::HasSubstr;

const std::vector<float> kW = {0.3f, -1.7f, 2.9f, 1e-3f, -4.1f, 0.7f};
const std::vector<float> kB = {0.5f, 0.25f, -0.125f};

class SessionReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testutil::MakeEngine(/*num_threads=*/2);
    ASSERT_NE(engine_, nullptr);
  }

  // w: 2x3 (6 elements), b: 3; AdamW lr 0.1.
  std::shared_ptr<Session> MakeSession(GradientMode mode, int trainers) {
    SessionConfig config = testutil::TwoParamConfig(testutil::AdamW(0.1, 0.5));
    config.num_trainers = trainers;
    config.mode = mode;
    return testutil::MakeSession(*engine_, config);
  }

  // Trainer 0 of a one-trainer session applies step 1 with w and b in one chunk each.
  std::shared_ptr<Session> AppliedStep(StepOutcome* outcome) {
    auto s = MakeSession(GradientMode::kSharded, 1);
    StepHandle c = BeginStep(*s, 1, 0);
    EXPECT_THAT(SendGradient(*s, c, 0, 0, kW), IsOk());
    EXPECT_THAT(SendGradient(*s, c, 1, 0, kB), IsOk());
    Outcome o;
    EXPECT_THAT(s->Commit(c, 9, o.Callback()), IsOk());
    EXPECT_THAT(o.Wait().status(), IsOk());
    if (o.Wait().ok()) *outcome = *o.Wait();
    return s;
  }

  std::unique_ptr<Engine> engine_;
};

// Elements [begin, end) of `values`.
std::vector<float> Part(const std::vector<float>& values, size_t begin, size_t end) {
  return std::vector<float>(values.begin() + begin, values.begin() + end);
}

TEST_F(SessionReplayTest, TheSameBytesChunkedOtherwiseAreAReplay) {
  StepOutcome applied;
  auto s = AppliedStep(&applied);
  const std::vector<float> w = ParamValues(*s, 0);
  StepHandle replay = BeginStep(*s, 1, 0);
  ASSERT_TRUE(replay.replay);
  // Odd cuts: the 8-byte words [0, 2) and [4, 6) of w each come in two chunks, in any order.
  ASSERT_THAT(SendGradient(*s, replay, 1, 0, kB), IsOk());
  ASSERT_THAT(SendGradient(*s, replay, 0, 3, Part(kW, 3, 5)), IsOk());
  ASSERT_THAT(SendGradient(*s, replay, 0, 0, Part(kW, 0, 1)), IsOk());
  ASSERT_THAT(SendGradient(*s, replay, 0, 5, Part(kW, 5, 6)), IsOk());
  ASSERT_THAT(SendGradient(*s, replay, 0, 1, Part(kW, 1, 3)), IsOk());
  Outcome o;
  ASSERT_THAT(s->Commit(replay, 9, o.Callback()), IsOk());
  ASSERT_THAT(o.Wait().status(), IsOk());
  EXPECT_EQ(o.Wait()->step, 1u);
  EXPECT_EQ(o.Wait()->grad_norm, applied.grad_norm);
  EXPECT_EQ(ParamValues(*s, 0), w);
  EXPECT_EQ(s->stats().step, 1u);
}

// The hijack: another caller applied step 1 as trainer 0; the owner's own step 1 with her
// gradient is refused, not answered with the other's result.
TEST_F(SessionReplayTest, OtherBytesForAnAppliedStepAreRefusedAndChangeNothing) {
  StepOutcome applied;
  auto s = AppliedStep(&applied);
  const std::vector<float> w = ParamValues(*s, 0), b = ParamValues(*s, 1);
  const std::string refused = absl::StrCat("step 1 of session '", s->id(),
                                           "' was already applied with a different contribution "
                                           "from trainer 0 (this one has other gradient bytes)");
  std::vector<float> other_w = kW;
  other_w[4] = 1.0f;
  StepHandle replay = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, replay, 0, 0, other_w), IsOk());
  ASSERT_THAT(SendGradient(*s, replay, 1, 0, kB), IsOk());
  Outcome o;
  EXPECT_THAT(s->Commit(replay, 9, o.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition, refused));
  // Nothing at all, or a part of the gradient, is another contribution too.
  StepHandle empty = BeginStep(*s, 1, 0);
  EXPECT_THAT(s->Commit(empty, 0, o.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition, refused));
  StepHandle part = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, part, 0, 0, kW), IsOk());
  EXPECT_THAT(s->Commit(part, 6, o.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition, refused));
  EXPECT_FALSE(o.HasBeenNotified());
  EXPECT_EQ(ParamValues(*s, 0), w);
  EXPECT_EQ(ParamValues(*s, 1), b);
  EXPECT_EQ(s->stats().step, 1u);
  // The session goes on with step 2.
  StepHandle next = BeginStep(*s, 2, 0);
  ASSERT_THAT(SendGradient(*s, next, 0, 0, other_w), IsOk());
  ASSERT_THAT(SendGradient(*s, next, 1, 0, kB), IsOk());
  Outcome step2;
  ASSERT_THAT(s->Commit(next, 9, step2.Callback()), IsOk());
  ASSERT_THAT(step2.Wait().status(), IsOk());
  EXPECT_EQ(step2.Wait()->step, 2u);
}

TEST_F(SessionReplayTest, AnotherScheduleForAnAppliedStepIsRefused) {
  StepOutcome applied;
  auto s = AppliedStep(&applied);
  StepBegin begin;
  begin.step = 1;
  begin.schedules[0].lr = 0.05;
  EXPECT_THAT(s->Begin(begin).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "was already applied with a different contribution from trainer 0 (this "
                       "one has group 0 lr 0.05, weight_decay 0.5 where it sent lr 0.1"));
  begin.schedules[0].lr = 0.1;  // the default it was applied with
  EXPECT_THAT(s->Begin(begin).status(), IsOk());
}

TEST_F(SessionReplayTest, ARetryOfACommittedContributionMustSendTheSameBytes) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, kW), IsOk());
  Outcome first;
  ASSERT_THAT(s->Commit(t0, 6, first.Callback()), IsOk());
  // Trainer 0 is sent again with another gradient while the step waits for trainer 1.
  std::vector<float> other_w = kW;
  other_w[0] = 9.0f;
  StepHandle other = BeginStep(*s, 1, 0);
  ASSERT_TRUE(other.retry);
  ASSERT_THAT(SendGradient(*s, other, 0, 0, other_w), IsOk());
  Outcome refused;
  EXPECT_THAT(s->Commit(other, 6, refused.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("step 1 of session '", s->id(),
                                    "' was already committed with a different contribution from "
                                    "trainer 0 (this one has other gradient bytes)")));
  // Its own retry, chunked otherwise, waits for the step in the first commit's place: the stream
  // the trainer left ends.
  StepHandle retry = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, retry, 0, 4, Part(kW, 4, 6)), IsOk());
  ASSERT_THAT(SendGradient(*s, retry, 0, 0, Part(kW, 0, 4)), IsOk());
  Outcome second;
  ASSERT_THAT(s->Commit(retry, 6, second.Callback()), IsOk());
  StepHandle t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, kB), IsOk());
  Outcome third;
  ASSERT_THAT(s->Commit(t1, 3, third.Callback()), IsOk());
  EXPECT_THAT(first.Wait().status(),
              StatusIs(absl::StatusCode::kAborted,
                       absl::StrCat("session '", s->id(),
                                    "': step 1 of trainer 0: a newer stream "
                                    "of the trainer waits for the step in this one's place")));
  ASSERT_THAT(third.Wait().status(), IsOk());
  ASSERT_THAT(second.Wait().status(), IsOk());
  EXPECT_FALSE(refused.HasBeenNotified());
  // The step ran with the gradient committed first: the same as a session that never saw the
  // other one.
  StepOutcome undisturbed;
  auto clean = AppliedStep(&undisturbed);
  EXPECT_EQ(ParamValues(*s, 0), ParamValues(*clean, 0));
  EXPECT_EQ(third.Wait()->grad_norm, undisturbed.grad_norm);
}

// REPLICATED: elements summed by a broken attempt are skipped when resent; a resend with other
// values there is refused at the commit rather than summed in part, and the right one still
// goes through.
TEST_F(SessionReplayTest, AReplicatedResendWithOtherValuesIsRefused) {
  auto s = MakeSession(GradientMode::kReplicated, 2);
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, kW), IsOk());
  ASSERT_THAT(SendGradient(*s, t0, 1, 0, kB), IsOk());
  Outcome o0;
  ASSERT_THAT(s->Commit(t0, 9, o0.Callback()), IsOk());
  StepHandle t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t1, 0, 0, Part(kW, 0, 3)), IsOk());
  t1 = BeginStep(*s, 1, 1);  // the stream broke after [0, 3) was summed
  std::vector<float> other_w = kW;
  other_w[1] = 5.0f;
  ASSERT_THAT(SendGradient(*s, t1, 0, 0, other_w), IsOk());
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, kB), IsOk());
  Outcome o1;
  EXPECT_THAT(s->Commit(t1, 9, o1.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "step 1: trainer 1 resent elements it had sent before with other values"));
  t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t1, 0, 0, kW), IsOk());
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, kB), IsOk());
  ASSERT_THAT(s->Commit(t1, 9, o1.Callback()), IsOk());
  ASSERT_THAT(o1.Wait().status(), IsOk());
  ASSERT_THAT(o0.Wait().status(), IsOk());
  EXPECT_EQ(s->stats().step, 1u);
}

// A replay's chunks are bounded as a first send's are: one outside its parameter is refused
// naming the range, and a replay sent in more pieces than a step's gradients may come in is
// refused once it passes them. (Only digested, they were taken whatever their range or number,
// each growing the digest.)
TEST_F(SessionReplayTest, AReplaysChunksAreBoundedAsAFirstSendsAre) {
  StepOutcome applied;
  auto s = AppliedStep(&applied);
  StepHandle replay = BeginStep(*s, 1, 0);
  ASSERT_TRUE(replay.replay);
  EXPECT_THAT(SendGradient(*s, replay, 0, 5, {1.0f, 2.0f}),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk [5, 7) exceeds 6 elements"));
  constexpr int kMost = 100000;
  absl::Status sent;
  int chunks = 0;
  while (chunks < kMost && sent.ok()) {
    sent = SendGradient(*s, replay, 0, chunks % 6, {kW[chunks % 6]});
    ++chunks;
  }
  EXPECT_THAT(sent, StatusIs(absl::StatusCode::kResourceExhausted, "pieces already"));
  EXPECT_LT(chunks, kMost);
}

}  // namespace
}  // namespace optstep
