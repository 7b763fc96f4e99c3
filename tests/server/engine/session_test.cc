// Step semantics of one rank (docs/design.md §3): coverage, idempotency, atomicity, skip on
// non-finite gradients, clipping, deadlines — through the real Session, engine and CPU device.

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BeginStep;
using ::optstep::testutil::Floats;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::ParamValues;
using ::optstep::testutil::SendGradient;
using ::optstep::testutil::StatusIs;
using ::testing::HasSubstr;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testutil::MakeEngine(/*num_threads=*/2);
    ASSERT_NE(engine_, nullptr);
  }

  // w: 2x3 (6 elements), b: 3. AdamW lr 0.1, wd 0.5 (w only; b is 1-D so wd_mult 0).
  std::shared_ptr<Session> MakeSession(GradientMode mode, int trainers, double clip = 0.0,
                                       absl::Duration deadline = absl::Seconds(30)) {
    SessionConfig config = testutil::TwoParamConfig(testutil::AdamW(0.1, 0.5));
    config.chain.clip_grad = clip;
    config.num_trainers = trainers;
    config.mode = mode;
    config.step_deadline = deadline;
    return testutil::MakeSession(*engine_, config);
  }

  std::unique_ptr<Engine> engine_;
};

// Float64 AdamW of one element (spec §3.1), first step from zero state.
double AdamFirstStep(double p, double g, double lr, double wd) {
  const double m = 0.1 * g, v = 0.001 * g * g;
  const double d = (m / 0.1) / (std::sqrt(v / 0.001) + 1e-8) + wd * p;
  return p - lr * d;
}

TEST_F(SessionTest, ShardedTrainersTogetherCoverEveryElement) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepHandle t0 = BeginStep(*s, 1, 0);
  StepHandle t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3}), IsOk());
  ASSERT_THAT(SendGradient(*s, t1, 0, 3, {4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, {-1, 0, 1}), IsOk());
  Outcome o0, o1;
  ASSERT_THAT(s->Commit(t0, 3, o0.Callback()), IsOk());
  EXPECT_FALSE(o0.HasBeenNotified());
  ASSERT_THAT(s->Commit(t1, 6, o1.Callback()), IsOk());
  auto r0 = o0.Wait();
  auto r1 = o1.Wait();
  ASSERT_THAT(r0.status(), IsOk());
  ASSERT_THAT(r1.status(), IsOk());
  EXPECT_EQ(r0->step, 1u);
  EXPECT_FALSE(r0->skipped);
  EXPECT_NEAR(r0->grad_norm, std::sqrt(91.0 + 2.0), 1e-9);
  EXPECT_EQ(r0->params, r1->params);  // serialised once, shared
  const std::vector<float> w = Floats(r0->params->values[0]);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], AdamFirstStep(0, i + 1, 0.1, 0.5), 1e-7);
  const std::vector<float> b = Floats(r0->params->values[1]);
  EXPECT_NEAR(b[0], 0.1, 1e-6);  // -lr * sign(g)
  EXPECT_EQ(b[1], 0.0f);
  EXPECT_NEAR(b[2], -0.1, 1e-6);
}

TEST_F(SessionTest, CommitWithMissingCoverageIsRefusedAndCanBeResent) {
  auto s = MakeSession(GradientMode::kSharded, 1);
  StepHandle c = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, c, 1, 0, {1}), IsOk());
  Outcome o;
  EXPECT_THAT(s->Commit(c, 0, o.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b': gradient elements [1, 3)"));
  // The trainer begins again and sends everything.
  c = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, c, 1, 0, {1, 2, 3}), IsOk());
  ASSERT_THAT(s->Commit(c, 9, o.Callback()), IsOk());
  EXPECT_THAT(o.Wait().status(), IsOk());
}

TEST_F(SessionTest, OverlapDuplicateAndOutOfRangeChunksAreRefused) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepHandle t0 = BeginStep(*s, 1, 0);
  StepHandle t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3}), IsOk());
  EXPECT_THAT(SendGradient(*s, t1, 0, 2, {1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "chunk [2, 4) from trainer 1 overlaps chunk [0, 3) from trainer 0"));
  EXPECT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, "duplicates"));
  EXPECT_THAT(SendGradient(*s, t0, 0, 5, {1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk [5, 7) exceeds 6 elements"));
  EXPECT_THAT(SendGradient(*s, t0, 7, 0, {1}), StatusIs(absl::StatusCode::kNotFound, "param_id 7"));
  float three = 1;
  EXPECT_THAT(s->AddGradient(t0, 1, 0, DType::kF32, &three, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, "3 bytes is not a multiple"));
}

TEST_F(SessionTest, StepOutOfSequenceNamesTheExpectedStep) {
  auto s = MakeSession(GradientMode::kSharded, 1);
  StepBegin begin;
  begin.step = 3;
  EXPECT_THAT(s->Begin(begin).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                 "step 3 out of sequence; expected step 1"));
  begin.step = 1;
  begin.trainer = 1;
  EXPECT_THAT(s->Begin(begin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "trainer_id 1 out of range"));
}

TEST_F(SessionTest, RetriedCommitAndReplayedStepDoNotApplyTwice) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  Outcome first;
  ASSERT_THAT(s->Commit(t0, 0, first.Callback()), IsOk());
  // Trainer 0's stream breaks; it reconnects and resends the same step, which is not added again.
  StepHandle retry = BeginStep(*s, 1, 0);
  EXPECT_TRUE(retry.retry);
  ASSERT_THAT(SendGradient(*s, retry, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  Outcome second;
  ASSERT_THAT(s->Commit(retry, 0, second.Callback()), IsOk());
  StepHandle t1 = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, {1, 1, 1}), IsOk());
  Outcome third;
  ASSERT_THAT(s->Commit(t1, 0, third.Callback()), IsOk());
  auto r = third.Wait();
  ASSERT_THAT(r.status(), IsOk());
  // The broken stream ends: the retry waits for the step in its place.
  EXPECT_THAT(first.Wait().status(), StatusIs(absl::StatusCode::kAborted, "a newer stream"));
  ASSERT_THAT(second.Wait().status(), IsOk());
  const std::vector<float> after = ParamValues(*s, 0);
  EXPECT_NEAR(after[0], AdamFirstStep(0, 1, 0.1, 0.5), 1e-7);
  // After the step was applied, the same step again replays its result without applying.
  StepHandle replay = BeginStep(*s, 1, 1);
  EXPECT_TRUE(replay.replay);
  ASSERT_THAT(SendGradient(*s, replay, 1, 0, {1, 1, 1}), IsOk());
  Outcome replayed;
  ASSERT_THAT(s->Commit(replay, 0, replayed.Callback()), IsOk());
  auto rr = replayed.Wait();
  ASSERT_THAT(rr.status(), IsOk());
  EXPECT_EQ(rr->step, 1u);
  EXPECT_EQ(rr->grad_norm, r->grad_norm);
  EXPECT_EQ(ParamValues(*s, 0), after);
  EXPECT_EQ(s->stats().step, 1u);
}

TEST_F(SessionTest, NonFiniteGradientSkipsTheStepAndChangesNothing) {
  auto s = MakeSession(GradientMode::kSharded, 1);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const uint64_t step = s->stats().step + 1;
    StepHandle c = BeginStep(*s, step, 0);
    ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
    ASSERT_THAT(SendGradient(*s, c, 1, 0, {1, bad, 1}), IsOk());
    Outcome o;
    ASSERT_THAT(s->Commit(c, 0, o.Callback()), IsOk());
    auto r = o.Wait();
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_TRUE(r->skipped);
    EXPECT_EQ(r->grad_norm, 0.0);
    EXPECT_EQ(ParamValues(*s, 0), std::vector<float>(6, 0.0f));
  }
  EXPECT_EQ(s->stats().skipped_steps, 2u);
  // The Adam counter did not advance: the next real step is a first step (t = 1).
  StepHandle c = BeginStep(*s, 3, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, c, 1, 0, {1, 1, 1}), IsOk());
  Outcome o;
  ASSERT_THAT(s->Commit(c, 0, o.Callback()), IsOk());
  ASSERT_THAT(o.Wait().status(), IsOk());
  EXPECT_NEAR(ParamValues(*s, 0)[1], AdamFirstStep(0, 2, 0.1, 0.5), 1e-7);
}

TEST_F(SessionTest, ClippingScalesEveryGradientOnlyAboveTheThreshold) {
  // SGD makes the applied gradient visible: p = -lr * g_clipped.
  SessionConfig config;
  config.params = {ParamInfo{"w", {2, 2}}};
  SubOptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.kind = "sgd";
  sgd.sgd.lr = 1.0;
  config.chain.sub_optimizers = {sgd};
  config.chain.clip_grad = 1.0;
  auto s = engine_->CreateSession(config)->session;
  StepHandle c = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {3, 0, 0, 4}), IsOk());  // norm 5
  Outcome o;
  ASSERT_THAT(s->Commit(c, 0, o.Callback()), IsOk());
  auto r = o.Wait();
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_TRUE(r->clipped);
  EXPECT_DOUBLE_EQ(r->grad_norm, 5.0);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(ParamValues(*s, 0), (std::vector<float>{-3 * coef, 0, 0, -4 * coef}));
  // Below the threshold the gradient is used bit for bit.
  c = BeginStep(*s, 2, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {0.5f, 0, 0, 0.25f}), IsOk());
  Outcome o2;
  ASSERT_THAT(s->Commit(c, 0, o2.Callback()), IsOk());
  auto r2 = o2.Wait();
  EXPECT_FALSE(r2->clipped);
  EXPECT_EQ(ParamValues(*s, 0), (std::vector<float>{-3 * coef - 0.5f, 0, 0, -4 * coef - 0.25f}));
}

// fp32 addition is not associative: 1 + 1e-8 rounds to 1, so trainer order (1 + 1e-8) - 1 gives
// 0 while the arrival order (-1 + 1) + 1e-8 gives 1e-8, and AdamW's first step moves a parameter
// by about lr/4 for any non-zero gradient. The sum must be in trainer order, in one buffer.
TEST_F(SessionTest, ReplicatedGradientsAreSummedInTrainerOrderInOneBuffer) {
  auto s = MakeSession(GradientMode::kReplicated, 3);
  EXPECT_EQ(s->stats().buffer_bytes, (6 + 3) * 4);  // one gradient buffer, not one per trainer
  const std::vector<float> w_of = {1.0f, 1e-8f, -1.0f};
  std::vector<Outcome> outcomes(3);
  std::vector<StepHandle> contributions(3);
  for (int t : {2, 0, 1}) {  // arrival order
    StepHandle& c = contributions[t];
    c = BeginStep(*s, 1, t);
    ASSERT_THAT(SendGradient(*s, c, 0, 0, std::vector<float>(6, w_of[t])), IsOk());
    ASSERT_THAT(SendGradient(*s, c, 1, 0, std::vector<float>(3, 0.1f * (t + 1))), IsOk());
  }
  for (int t : {2, 0, 1}) {
    ASSERT_THAT(s->Commit(contributions[t], 9, outcomes[t].Callback()), IsOk());
  }
  // Every callback must have run before `outcomes` goes out of scope.
  for (Outcome& o : outcomes) ASSERT_THAT(o.Wait().status(), IsOk());
  auto r = outcomes[0].Wait();
  const float mean_b = ((0.1f + 0.2f) + 0.3f) * (1.0f / 3.0f);
  EXPECT_EQ(r->grad_norm, std::sqrt(3.0 * static_cast<double>(mean_b) * mean_b));
  EXPECT_EQ(ParamValues(*s, 0), std::vector<float>(6, 0.0f));
}

// A later trainer's chunk waits for its turn (the stream pauses): it is added once the trainers
// before it sent all of the parameter, and dropped (ABORTED) when its trainer begins again.
TEST_F(SessionTest, ReplicatedChunkWaitsForTheEarlierTrainers) {
  auto s = MakeSession(GradientMode::kReplicated, 2);
  StepHandle t1 = BeginStep(*s, 1, 1);
  const std::vector<float> ones(6, 1.0f);
  const absl::string_view bytes(reinterpret_cast<const char*>(ones.data()), 24);
  absl::Status added = absl::UnknownError("not called");
  int calls = 0;
  auto on_added = [&](absl::Status status) {
    added = status;
    ++calls;
  };
  auto fate = s->AddGradient(t1, 0, 0, DType::kF32, {bytes}, nullptr, on_added);
  ASSERT_THAT(fate.status(), IsOk());
  EXPECT_EQ(*fate, Session::ChunkFate::kWaiting);
  // The trainer begins again: its waiting chunk is dropped.
  t1 = BeginStep(*s, 1, 1);
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(added, StatusIs(absl::StatusCode::kAborted, "began the step again"));
  fate = s->AddGradient(t1, 0, 0, DType::kF32, {bytes}, nullptr, on_added);
  ASSERT_THAT(fate.status(), IsOk());
  EXPECT_EQ(*fate, Session::ChunkFate::kWaiting);
  // Trainer 0's first half of `w` is not enough; its second half lets trainer 1's chunk in.
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {2, 2, 2}), IsOk());
  EXPECT_EQ(calls, 1);
  ASSERT_THAT(SendGradient(*s, t0, 0, 3, {4, 4, 4}), IsOk());
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(added, IsOk());
  // Parameter `b` is trainer 1's turn only after trainer 0 sent it: a sync send copies and waits.
  ASSERT_THAT(SendGradient(*s, t1, 1, 0, {1, 1, 1}), IsOk());
  ASSERT_THAT(SendGradient(*s, t0, 1, 0, {3, 3, 3}), IsOk());
  Outcome o0, o1;
  ASSERT_THAT(s->Commit(t0, 9, o0.Callback()), IsOk());
  ASSERT_THAT(s->Commit(t1, 9, o1.Callback()), IsOk());
  auto r = o0.Wait();
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_THAT(o1.Wait().status(), IsOk());
  // Means: w = (1.5, 1.5, 1.5, 2.5, 2.5, 2.5), b = (2, 2, 2).
  EXPECT_EQ(r->grad_norm, std::sqrt(3 * 1.5 * 1.5 + 3 * 2.5 * 2.5 + 3 * 2.0 * 2.0));
}

// REPLICATED: a trainer that loses its stream after part of its gradient was summed begins again
// and resends everything; what was summed already is skipped, so the step is bit-identical to an
// undisturbed one, whatever the resend's chunking.
TEST_F(SessionTest, ReplicatedResendAfterABrokenStreamIsBitIdentical) {
  const std::vector<float> w0 = {0.3f, -1.7f, 2.9f, 1e-3f, -4.1f, 0.7f};
  const std::vector<float> w1 = {1.1f, 0.2f, -0.6f, 3.3f, 1e-5f, -2.2f};
  const std::vector<float> b0 = {0.5f, 0.25f, -0.125f}, b1 = {-1.5f, 2.5f, 0.75f};
  auto run = [&](bool disturb) {
    auto s = MakeSession(GradientMode::kReplicated, 2);
    StepHandle t0 = BeginStep(*s, 1, 0);
    StepHandle t1 = BeginStep(*s, 1, 1);
    EXPECT_THAT(SendGradient(*s, t0, 0, 0, w0), IsOk());
    EXPECT_THAT(SendGradient(*s, t0, 1, 0, b0), IsOk());
    if (disturb) {
      EXPECT_THAT(SendGradient(*s, t1, 0, 0, {w1[0], w1[1], w1[2], w1[3]}), IsOk());
      t1 = BeginStep(*s, 1, 1);  // the stream broke; resend, chunked otherwise
      EXPECT_THAT(SendGradient(*s, t1, 0, 0, {w1[0], w1[1]}), IsOk());
      EXPECT_THAT(SendGradient(*s, t1, 0, 2, {w1[2], w1[3], w1[4], w1[5]}), IsOk());
    } else {
      EXPECT_THAT(SendGradient(*s, t1, 0, 0, w1), IsOk());
    }
    EXPECT_THAT(SendGradient(*s, t1, 1, 0, b1), IsOk());
    Outcome o0, o1;
    EXPECT_THAT(s->Commit(t0, 9, o0.Callback()), IsOk());
    EXPECT_THAT(s->Commit(t1, 9, o1.Callback()), IsOk());
    EXPECT_THAT(o0.Wait().status(), IsOk());
    EXPECT_THAT(o1.Wait().status(), IsOk());
    return std::make_pair(ParamValues(*s, 0), ParamValues(*s, 1));
  };
  const auto undisturbed = run(false);
  const auto resent = run(true);
  EXPECT_EQ(resent.first, undisturbed.first);
  EXPECT_EQ(resent.second, undisturbed.second);
  EXPECT_NE(undisturbed.first, std::vector<float>(6, 0.0f));
}

TEST_F(SessionTest, ReplicatedTrainerMustSendEverything) {
  auto s = MakeSession(GradientMode::kReplicated, 2);
  StepHandle c = BeginStep(*s, 1, 1);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  Outcome o;
  // A chunk still waiting for its turn (trainer 0 sent nothing yet) is not there yet.
  EXPECT_THAT(s->Commit(c, 0, o.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'w': gradient elements [0, 6) of 6 missing from trainer 1"));
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  EXPECT_THAT(s->Commit(c, 0, o.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'b': gradient elements [0, 3) of 3 missing from trainer 1"));
}

TEST_F(SessionTest, IncompleteStepIsAbortedAfterTheDeadlineWithStateUnchanged) {
  auto s = MakeSession(GradientMode::kSharded, 2, 0.0, absl::Milliseconds(200));
  StepHandle t0 = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, t0, 1, 0, {1, 2, 3}), IsOk());
  Outcome o;
  ASSERT_THAT(s->Commit(t0, 0, o.Callback()), IsOk());
  EXPECT_THAT(o.Wait().status(), StatusIs(absl::StatusCode::kAborted, "redo the step"));
  EXPECT_EQ(s->stats().step, 0u);
  EXPECT_EQ(ParamValues(*s, 0), std::vector<float>(6, 0.0f));
  // The stale contribution is refused; the step can be redone.
  EXPECT_THAT(SendGradient(*s, t0, 0, 0, {1}), StatusIs(absl::StatusCode::kAborted));
  StepHandle again = BeginStep(*s, 1, 0);
  EXPECT_FALSE(again.retry);
  EXPECT_THAT(SendGradient(*s, again, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
}

TEST_F(SessionTest, DeadlineAbortNamesTheTrainersThatHadNotCommitted) {
  auto s = MakeSession(GradientMode::kSharded, 4, 0.0, absl::Milliseconds(200));
  StepHandle t0 = BeginStep(*s, 1, 0);
  StepHandle t2 = BeginStep(*s, 1, 2);
  BeginStep(*s, 1, 1);  // begins, never commits; trainer 3 never begins
  ASSERT_THAT(SendGradient(*s, t0, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, t2, 1, 0, {1, 2, 3}), IsOk());
  Outcome o0, o2;
  ASSERT_THAT(s->Commit(t0, 0, o0.Callback()), IsOk());
  ASSERT_THAT(s->Commit(t2, 0, o2.Callback()), IsOk());
  const std::string expected =
      absl::StrCat("session '", s->id(),
                   "': step 1 aborted after the 200ms step deadline; trainers 1, 3 of 4 had not "
                   "committed on rank 0 (trainer 3 had not begun); redo the step");
  EXPECT_THAT(o0.Wait().status(), StatusIs(absl::StatusCode::kAborted, expected));
  EXPECT_THAT(o2.Wait().status(), StatusIs(absl::StatusCode::kAborted, expected));
  // The next attempt starts afresh: only the trainers missing from it are named.
  StepHandle again = BeginStep(*s, 1, 0);
  for (int t = 1; t < 4; ++t) BeginStep(*s, 1, t);
  ASSERT_THAT(SendGradient(*s, again, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  ASSERT_THAT(SendGradient(*s, again, 1, 0, {1, 2, 3}), IsOk());
  Outcome redo;
  ASSERT_THAT(s->Commit(again, 0, redo.Callback()), IsOk());
  EXPECT_THAT(redo.Wait().status(),
              StatusIs(absl::StatusCode::kAborted,
                       "trainers 1, 2, 3 of 4 had not committed on rank 0; redo the step"));
  EXPECT_EQ(s->stats().step, 0u);
}

TEST_F(SessionTest, TrainersMustAgreeOnTheSchedule) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepBegin begin;
  begin.step = 1;
  begin.schedules[0].lr = 0.01;
  ASSERT_THAT(s->Begin(begin).status(), IsOk());
  begin.trainer = 1;
  begin.schedules[0].lr = 0.02;
  EXPECT_THAT(s->Begin(begin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "trainer 1 gives group 0 lr 0.02"));
  begin.schedules[0].lr = -1;
  EXPECT_THAT(s->Begin(begin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "lr = -1 must be finite and >= 0"));
  begin.schedules.clear();
  begin.schedules[5].lr = 0.01;
  EXPECT_THAT(s->Begin(begin).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown group 5"));
}

TEST_F(SessionTest, InitialValuesOnlyBeforeTheFirstStep) {
  auto s = MakeSession(GradientMode::kSharded, 1);
  std::vector<float> init = {1, 2, 3};
  ASSERT_THAT(s->InitValues(1, 0, DType::kF32, init.data(), 12), IsOk());
  EXPECT_EQ(ParamValues(*s, 1), init);
  EXPECT_THAT(s->InitValues(1, 1, DType::kF32, init.data(), 12),
              StatusIs(absl::StatusCode::kInvalidArgument, "values [1, 4) exceed 3 elements"));
  StepHandle c = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  EXPECT_THAT(s->InitValues(1, 0, DType::kF32, init.data(), 12),
              StatusIs(absl::StatusCode::kFailedPrecondition, "before the first step"));
}

// Initial values whose call was cancelled while their write waited its turn on the coordinator
// are not written (its caller was told it failed), nor into a session closed meanwhile.
TEST_F(SessionTest, InitialValuesOfACancelledCallOrAClosedSessionAreNotWritten) {
  auto s = MakeSession(GradientMode::kSharded, 1);
  const std::vector<float> init = {1, 2, 3};
  const std::vector<Session::InitPiece> pieces = {
      {1, 0, DType::kF32, absl::string_view(reinterpret_cast<const char*>(init.data()), 12)}};
  absl::Notification written;
  absl::Status status;
  s->InitValues(
      pieces,
      [&](absl::Status answered) {
        status = std::move(answered);
        written.Notify();
      },
      [] { return true; });
  written.WaitForNotification();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled, "nothing was written"));
  EXPECT_EQ(ParamValues(*s, 1), std::vector<float>(3, 0.0f));
  s->Close();
  EXPECT_THAT(s->InitValues(1, 0, DType::kF32, init.data(), 12),
              StatusIs(absl::StatusCode::kUnavailable, "is closed"));
}

TEST_F(SessionTest, ClosedSessionAbortsWaitersAndRefusesSteps) {
  auto s = MakeSession(GradientMode::kSharded, 2);
  StepHandle c = BeginStep(*s, 1, 0);
  ASSERT_THAT(SendGradient(*s, c, 0, 0, {1, 2, 3, 4, 5, 6}), IsOk());
  Outcome o;
  ASSERT_THAT(s->Commit(c, 0, o.Callback()), IsOk());
  ASSERT_THAT(engine_->CloseSession(s->id()), IsOk());
  EXPECT_THAT(o.Wait().status(), StatusIs(absl::StatusCode::kUnavailable, "closed"));
  EXPECT_THAT(engine_->GetSession(s->id()).status(), StatusIs(absl::StatusCode::kNotFound));
  StepBegin begin;
  begin.step = 1;
  EXPECT_THAT(s->Begin(begin).status(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(SessionTest, ExportedStateImportedIntoAFreshSessionContinuesBitForBit) {
  auto run_step = [](Session& s, uint64_t step) {
    StepBegin begin;
    begin.step = step;
    auto c = s.Begin(begin);
    ASSERT_THAT(c.status(), IsOk());
    std::vector<float> w(6), b(3);
    for (int i = 0; i < 6; ++i) w[i] = 0.1f * ((step * 7 + i) % 5) - 0.2f;
    for (int i = 0; i < 3; ++i) b[i] = 0.05f * ((step + i) % 3);
    ASSERT_THAT(s.AddGradient(*c, 0, 0, DType::kF32, w.data(), 24), IsOk());
    ASSERT_THAT(s.AddGradient(*c, 1, 0, DType::kF32, b.data(), 12), IsOk());
    Outcome o;
    ASSERT_THAT(s.Commit(*c, 0, o.Callback()), IsOk());
    ASSERT_THAT(o.Wait().status(), IsOk());
  };
  auto export_state = [](Session& s) {
    absl::Notification done;
    absl::StatusOr<std::shared_ptr<const StateDict>> dict;
    s.holds().ExportState({}, [&](absl::StatusOr<std::shared_ptr<const StateDict>> d) {
      dict = std::move(d);
      done.Notify();
    });
    done.WaitForNotification();
    return dict;
  };
  auto import_state = [](Session& s, std::shared_ptr<const StateDict> dict) {
    absl::Notification done;
    absl::Status status;
    s.holds().ImportState(std::move(dict), [&](absl::Status st) {
      status = st;
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  auto first = MakeSession(GradientMode::kSharded, 1);
  for (uint64_t step = 1; step <= 3; ++step) run_step(*first, step);
  auto dict = export_state(*first);
  ASSERT_THAT(dict.status(), IsOk());
  EXPECT_EQ((*dict)->count("param/w"), 1u);
  EXPECT_EQ((*dict)->count("state/adam/w/exp_avg_sq"), 1u);
  EXPECT_EQ((*dict)->at("meta/step").type, StateTensor::Type::kI64);

  auto second = MakeSession(GradientMode::kSharded, 1);
  ASSERT_THAT(import_state(*second, *dict), IsOk());
  EXPECT_EQ(second->stats().step, 3u);
  EXPECT_EQ(ParamValues(*second, 0), ParamValues(*first, 0));
  for (uint64_t step = 4; step <= 5; ++step) {
    run_step(*first, step);
    run_step(*second, step);
  }
  EXPECT_EQ(ParamValues(*second, 0), ParamValues(*first, 0));
  EXPECT_EQ(ParamValues(*second, 1), ParamValues(*first, 1));

  // A wrong shape or an unknown key changes nothing.
  StateDict bad = **dict;
  bad["param/w"].shape = {3, 2};
  EXPECT_THAT(import_state(*second, std::make_shared<StateDict>(bad)),
              StatusIs(absl::StatusCode::kInvalidArgument, "state dict key 'param/w'"));
  StateDict unknown;
  unknown["state/adam/nope/exp_avg"] = (**dict).at("state/adam/w/exp_avg");
  EXPECT_THAT(import_state(*second, std::make_shared<StateDict>(unknown)),
              StatusIs(absl::StatusCode::kInvalidArgument, "no such parameter"));
  EXPECT_EQ(second->stats().step, 5u);
}

}  // namespace
}  // namespace optstep
