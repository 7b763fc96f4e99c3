#include "server/engine/step_book.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

const std::vector<std::string> kNames = {"a", "b"};
const absl::Time kNow = absl::FromUnixSeconds(1000);

SessionConfig ConfigOf(GradientMode mode, int trainers) {
  SessionConfig config;
  config.mode = mode;
  config.num_trainers = trainers;
  return config;
}

StepBegin BeginOf(uint64_t step, int trainer) {
  StepBegin begin;
  begin.step = step;
  begin.trainer = trainer;
  return begin;
}

StepSchedule ScheduleOf(double lr) { return StepSchedule{GroupStepSchedule{lr, 0.0}}; }

// Begins `trainer`'s part of `step` with lr 0.1 and answers the contribution.
StepHandle MustBegin(StepBook& book, uint64_t step, int trainer) {
  std::vector<WaitingChunk> superseded;
  absl::StatusOr<StepHandle> c =
      book.Begin(BeginOf(step, trainer), ScheduleOf(0.1), kNow, &superseded);
  EXPECT_THAT(c.status(), IsOk());
  EXPECT_TRUE(superseded.empty());
  return c.ok() ? *c : StepHandle{};
}

// Sends every element of both parameters (10 and 4) as `c`'s trainer and commits; `outcomes`
// receives what the waiter is told.
void SendAllAndCommit(StepBook& book, const StepHandle& c,
                      std::vector<absl::StatusOr<StepOutcome>>* outcomes) {
  ASSERT_THAT(book.contributions().AddRange(c.trainer, 0, 0, 10), IsOk());
  ASSERT_THAT(book.contributions().AddRange(c.trainer, 1, 0, 4), IsOk());
  ASSERT_THAT(
      book.Commit(c, 14,
                  [outcomes](absl::StatusOr<StepOutcome> o) { outcomes->push_back(std::move(o)); }),
      IsOk());
}

TEST(StepBookTest, BeginAnswersNewAttemptsRetriesAndReplaysInSequence) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 2), {10, 4}, &kNames);
  std::vector<WaitingChunk> superseded;
  EXPECT_THAT(book.Begin(BeginOf(2, 0), ScheduleOf(0.1), kNow, &superseded).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 1"));
  EXPECT_FALSE(book.step_began().has_value());

  const StepHandle first = MustBegin(book, 1, 0);
  EXPECT_EQ(first.attempt, 1u);
  EXPECT_FALSE(first.retry || first.replay);
  EXPECT_EQ(book.step_began(), kNow);
  // Another trainer must step with the same schedule.
  EXPECT_THAT(book.Begin(BeginOf(1, 1), ScheduleOf(0.2), kNow, &superseded).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));

  // Beginning again makes the first attempt stale.
  const StepHandle again = MustBegin(book, 1, 0);
  EXPECT_EQ(again.attempt, 2u);
  EXPECT_THAT(book.CheckFresh(first), StatusIs(absl::StatusCode::kAborted, "redo the step"));
  EXPECT_THAT(book.CheckFresh(again), IsOk());

  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  SendAllAndCommit(book, again, &outcomes);
  const StepHandle retry = MustBegin(book, 1, 0);  // committed already
  EXPECT_TRUE(retry.retry);
  EXPECT_FALSE(book.ready_to_apply());  // trainer 1 has not committed

  SendAllAndCommit(book, MustBegin(book, 1, 1), &outcomes);
  EXPECT_TRUE(book.ready_to_apply());
  book.set_running(true);
  EXPECT_FALSE(book.ready_to_apply());
  EXPECT_TRUE(MustBegin(book, 1, 1).retry);  // a resolution runs

  absl::StatusOr<StepOutcome> outcome = StepOutcome{};
  std::vector<WaitingChunk> stranded;
  const StepLedger::Ended ended = book.EndStep(outcome, &stranded);
  book.set_running(false);
  EXPECT_EQ(ended.step, 1u);
  EXPECT_EQ(ended.waiters.size(), 2u);
  EXPECT_EQ(outcome->step, 1u);
  EXPECT_EQ(book.counters().step, 1u);
  EXPECT_FALSE(book.step_began().has_value());
  EXPECT_THAT(book.CheckFresh(again), StatusIs(absl::StatusCode::kAborted));

  EXPECT_TRUE(MustBegin(book, 1, 0).replay);  // the step just applied
  EXPECT_EQ(MustBegin(book, 2, 0).attempt, 3u);
}

// A retry begun while its step was resolved whose commit comes after the step was applied (a
// trainer's resend after a broken stream, racing the resolution) is answered as a replay of that
// step, not ABORTED: the step it resends is the one applied.
TEST(StepBookTest, ARetryWhoseStepWasAppliedMeanwhileIsAReplayOfIt) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 1), {10, 4}, &kNames);
  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  const StepHandle first = MustBegin(book, 1, 0);
  SendAllAndCommit(book, first, &outcomes);
  book.set_running(true);
  const StepHandle resent = MustBegin(book, 1, 0);
  ASSERT_TRUE(resent.retry);
  EXPECT_FALSE(book.AppliedSinceRetry(resent));  // the step is not applied yet

  absl::StatusOr<StepOutcome> outcome = StepOutcome{};
  std::vector<WaitingChunk> stranded;
  book.EndStep(outcome, &stranded);
  book.set_running(false);
  EXPECT_THAT(book.CheckFresh(resent), IsOk());
  EXPECT_TRUE(book.AppliedSinceRetry(resent));
  EXPECT_THAT(book.CheckFresh(first), StatusIs(absl::StatusCode::kAborted));  // no retry

  // Once a later step is applied, the retry's step is no longer the last one: stale.
  SendAllAndCommit(book, MustBegin(book, 2, 0), &outcomes);
  outcome = StepOutcome{};
  book.EndStep(outcome, &stranded);
  EXPECT_FALSE(book.AppliedSinceRetry(resent));
  EXPECT_THAT(book.CheckFresh(resent), StatusIs(absl::StatusCode::kAborted, "redo the step"));
}

// A retry whose step was aborted, not applied, stays stale: the step is redone.
TEST(StepBookTest, ARetryWhoseStepWasAbortedIsStale) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 1), {10, 4}, &kNames);
  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  SendAllAndCommit(book, MustBegin(book, 1, 0), &outcomes);
  book.set_running(true);
  const StepHandle resent = MustBegin(book, 1, 0);
  ASSERT_TRUE(resent.retry);
  absl::StatusOr<StepOutcome> failed = absl::UnavailableError("peer lost");
  std::vector<WaitingChunk> stranded;
  book.EndStep(failed, &stranded);
  book.set_running(false);
  EXPECT_FALSE(book.AppliedSinceRetry(resent));
  EXPECT_THAT(book.CheckFresh(resent), StatusIs(absl::StatusCode::kAborted));
}

TEST(StepBookTest, CommitDropsAContributionWithTheWrongCountOrMissingCoverage) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 2), {10, 4}, &kNames);
  const StepHandle c0 = MustBegin(book, 1, 0);
  ASSERT_THAT(book.contributions().AddRange(0, 0, 0, 10), IsOk());
  EXPECT_THAT(book.Commit(c0, 9, [](absl::StatusOr<StepOutcome>) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "commits 9 elements but sent 10"));
  EXPECT_EQ(book.contributions().elements_from(0), 0);  // dropped: it resends

  ASSERT_THAT(book.contributions().AddRange(0, 0, 0, 10), IsOk());
  EXPECT_THAT(book.Commit(c0, 0, [](absl::StatusOr<StepOutcome>) {}), IsOk());
  // The last trainer to commit completes the step: param 'b' is missing.
  const StepHandle c1 = MustBegin(book, 1, 1);
  EXPECT_THAT(book.Commit(c1, 0, [](absl::StatusOr<StepOutcome>) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b'"));
  EXPECT_FALSE(book.contributions().committed(1));
  EXPECT_FALSE(book.ready_to_apply());
}

TEST(StepBookTest, StreamingWaitersAreTakenApartInOrder) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 3), {10, 4}, &kNames);
  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  for (int t = 0; t < 3; ++t) {
    StepBegin begin = BeginOf(1, t);
    begin.stream_params = t != 1;
    begin.return_params = t != 2;
    std::vector<WaitingChunk> superseded;
    absl::StatusOr<StepHandle> c = book.Begin(begin, ScheduleOf(0.1), kNow, &superseded);
    ASSERT_THAT(c.status(), IsOk());
    SendAllAndCommit(book, *c, &outcomes);
  }
  const std::vector<StepWaiter> streaming = book.TakeStreamingWaiters();
  ASSERT_EQ(streaming.size(), 1u);  // trainer 0: streams and wants parameters
  EXPECT_TRUE(streaming[0].stream);
  EXPECT_TRUE(streaming[0].want_params);

  absl::StatusOr<StepOutcome> failed = absl::InternalError("lost");
  std::vector<WaitingChunk> stranded;
  const StepLedger::Ended ended = book.EndStep(failed, &stranded);
  EXPECT_EQ(ended.step, 1u);  // the step that ended, not applied
  EXPECT_EQ(ended.waiters.size(), 2u);
  EXPECT_EQ(book.counters().step, 0u);
  EXPECT_FALSE(book.last_outcome().has_value());
}

TEST(StepBookTest, AbortTellsTheWaitersAndTheWaitingChunks) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 2), {10, 4}, &kNames);
  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  SendAllAndCommit(book, MustBegin(book, 1, 0), &outcomes);
  const StepHandle c1 = MustBegin(book, 1, 1);
  std::vector<absl::Status> added;
  WaitingChunk chunk;
  chunk.handle = c1;
  chunk.added = [&added](absl::Status s) { added.push_back(s); };
  book.order().Wait(std::move(chunk));

  std::vector<StepCallback> callbacks = book.Abort();
  ASSERT_EQ(callbacks.size(), 2u);
  for (StepCallback& done : callbacks) done(absl::AbortedError("aborted"));
  EXPECT_EQ(outcomes.size(), 1u);
  ASSERT_EQ(added.size(), 1u);
  EXPECT_EQ(added[0].code(), absl::StatusCode::kAborted);
  EXPECT_THAT(book.CheckFresh(c1), StatusIs(absl::StatusCode::kAborted));
  EXPECT_FALSE(book.contributions().started());
  EXPECT_EQ(book.pending().step, 1u);
  EXPECT_FALSE(book.pending().schedule.has_value());
}

TEST(StepBookTest, BeginningAgainTakesTheTrainersWaitingChunks) {
  StepBook book("s", 0, ConfigOf(GradientMode::kReplicated, 2), {10, 4}, &kNames);
  const StepHandle c1 = MustBegin(book, 1, 1);
  WaitingChunk chunk;
  chunk.handle = c1;
  chunk.param = 1;
  book.order().Wait(std::move(chunk));
  std::vector<WaitingChunk> superseded;
  ASSERT_THAT(book.Begin(BeginOf(1, 1), ScheduleOf(0.1), kNow, &superseded).status(), IsOk());
  ASSERT_EQ(superseded.size(), 1u);
  EXPECT_EQ(superseded[0].param, 1);
  EXPECT_EQ(book.order().num_waiting(), 0);
}

TEST(StepBookTest, AWrittenStateSetsTheCountersAndForgetsTheLastOutcome) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  std::vector<absl::StatusOr<StepOutcome>> outcomes;
  SendAllAndCommit(book, MustBegin(book, 1, 0), &outcomes);
  absl::StatusOr<StepOutcome> skipped = StepOutcome{};
  skipped->skipped = true;
  std::vector<WaitingChunk> stranded;
  book.EndStep(skipped, &stranded);
  EXPECT_EQ(book.counters().skipped_steps, 1u);
  book.snapshots()[DType::kF32] = nullptr;

  ResolvedState resolved;
  resolved.step = 7;
  book.WriteCounters(resolved);
  EXPECT_EQ(book.counters().step, 7u);
  EXPECT_EQ(book.counters().skipped_steps, 1u);  // not in the state: kept
  EXPECT_FALSE(book.last_outcome().has_value());
  EXPECT_TRUE(book.snapshots().empty());
  std::vector<WaitingChunk> superseded;
  EXPECT_THAT(book.Begin(BeginOf(7, 0), ScheduleOf(0.1), kNow, &superseded).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 8"));
}

// Sends every element of both parameters (10 and 4) as `c`'s trainer, digesting `bytes` as
// their values, and commits.
absl::Status SendDigestedAndCommit(StepBook& book, const StepHandle& c, const std::string& bytes) {
  OPTSTEP_RETURN_IF_ERROR(book.contributions().AddRange(c.trainer, 0, 0, 10));
  OPTSTEP_RETURN_IF_ERROR(book.contributions().AddRange(c.trainer, 1, 0, 4));
  ContributionDigest digest;
  const absl::string_view pieces[] = {bytes};
  digest.Add(0, DType::kF32, 0, pieces);
  book.contributions().AddDigests(c.trainer, digest, digest);
  return book.Commit(c, 14, [](absl::StatusOr<StepOutcome>) {});
}

// Step 1, committed by its one trainer ("committed"), is interrupted by a lost peer, and the group
// heals.
void InterruptAfterTheCommit(StepBook& book) {
  ASSERT_THAT(SendDigestedAndCommit(book, MustBegin(book, 1, 0), "committed"), IsOk());
  std::vector<WaitingChunk> stranded;
  absl::StatusOr<StepOutcome> lost = absl::UnavailableError("a peer was lost");
  book.MarkInterrupted(1);
  book.EndStep(lost, &stranded);
  book.Resume();  // the group healed
}

// A step interrupted after every trainer committed: its redo must bring what was committed
// (other ranks and shadows may have applied it), until a redo ends unapplied at its deadline
// (a trainer that computed the step again cannot bring it): the record then lapses, and the
// session goes on. Before the lapse, every redo was refused for ever.
TEST(StepBookTest, TheRecordOfAnInterruptedStepLapsesOnceARedoEndsUnapplied) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  ASSERT_NO_FATAL_FAILURE(InterruptAfterTheCommit(book));
  std::vector<WaitingChunk> stranded;
  EXPECT_THAT(SendDigestedAndCommit(book, MustBegin(book, 1, 0), "computed again"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "committed before a lost peer interrupted it"));
  absl::StatusOr<StepOutcome> aborted = absl::AbortedError("step deadline");
  book.EndStep(aborted, &stranded);
  EXPECT_THAT(SendDigestedAndCommit(book, MustBegin(book, 1, 0), "computed again"), IsOk());
}

// The same with a redo of another schedule (a trainer that rebuilt its learning rate schedule),
// refused at its Begin: the step's clock starts there, so that its deadline ends the step and the
// record lapses. Before, nothing started the clock and every redo was refused for ever.
TEST(StepBookTest, ARedoOfAnotherScheduleStartsTheStepsClock) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  ASSERT_NO_FATAL_FAILURE(InterruptAfterTheCommit(book));
  std::vector<WaitingChunk> stranded;
  std::vector<WaitingChunk> superseded;
  EXPECT_THAT(book.Begin(BeginOf(1, 0), ScheduleOf(0.2), kNow, &superseded).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "committed before a lost peer interrupted it"));
  EXPECT_EQ(book.step_began(), kNow);
  absl::StatusOr<StepOutcome> aborted = absl::AbortedError("step deadline");
  book.EndStep(aborted, &stranded);
  EXPECT_THAT(book.Begin(BeginOf(1, 0), ScheduleOf(0.2), kNow, &superseded).status(), IsOk());
}

// As a heal ends (Session::ResumeAfterHeal): the clock of a pending step starts again, and no
// clock starts where no step is pending.
TEST(StepBookTest, ARunningClockRestartsAndAStoppedOneStaysStopped) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  book.RestartClock(kNow);
  EXPECT_EQ(book.step_began(), std::nullopt);
  MustBegin(book, 1, 0);
  book.RestartClock(kNow + absl::Seconds(5));
  EXPECT_EQ(book.step_began(), kNow + absl::Seconds(5));
}

TEST(StepBookTest, ClosedOrBrokenRefusesSteps) {
  StepBook book("s", 3, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  const StepHandle c = MustBegin(book, 1, 0);
  book.MarkBroken();
  EXPECT_TRUE(book.broken());
  EXPECT_THAT(book.CheckUsable(), StatusIs(absl::StatusCode::kUnavailable, "rank 3 lost a peer"));
  EXPECT_THAT(book.CheckFresh(c), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(book.Close());
  EXPECT_FALSE(book.Close());
  std::vector<WaitingChunk> superseded;
  EXPECT_THAT(book.Begin(BeginOf(1, 0), ScheduleOf(0.1), kNow, &superseded).status(),
              StatusIs(absl::StatusCode::kUnavailable, "session 's' is closed"));
}

TEST(StepBookTest, TheClockStartsOnce) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  book.StartClock(kNow);
  book.StartClock(kNow + absl::Seconds(5));
  EXPECT_EQ(book.pending().began, kNow);
  MustBegin(book, 1, 0);
  EXPECT_EQ(book.step_began(), kNow);
}

TEST(StepBookTest, BetweenStepsUntilATrainerSendsOrAResolutionRuns) {
  StepBook book("s", 0, ConfigOf(GradientMode::kSharded, 1), {10, 4}, &kNames);
  EXPECT_TRUE(book.between_steps());
  const StepHandle c = MustBegin(book, 1, 0);
  EXPECT_TRUE(book.between_steps());  // begun, nothing sent
  ASSERT_THAT(book.contributions().AddRange(c.trainer, 0, 0, 10), IsOk());
  EXPECT_FALSE(book.between_steps());
  for (StepCallback& done : book.Abort()) done(absl::AbortedError("aborted"));
  EXPECT_TRUE(book.between_steps());
  book.set_running(true);
  EXPECT_FALSE(book.between_steps());
}

}  // namespace
}  // namespace optstep
