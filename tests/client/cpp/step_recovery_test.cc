// StepRecovery: a step that meets a recovering group waits for it and redoes itself with the
// same attempt; a step the restored session already applied answers its restored result; a
// session restored further back answers ABORTED carrying the restored step (RewindStep); an
// out-of-sequence step below the last step seen applied is a rewind too (once the session stays
// below it: a step's parameters come back before the ranks ended it, and a step sent meanwhile
// is sent again in its turn), one at or above it the caller's error; a session gone from a serving
// group answers the step's own error; a group that does not come back within the timeout answers
// the first error, naming the timeout, and so does a step that still fails once the group serves;
// zero timeout answers every error at once; other errors while rank 0 serves are answered as they
// are.

#include "client/cpp/step_recovery.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "base/status_payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::Optional;

// A group whose rank 0 serves from the `down`-th look on, with the session at `step`.
struct FakeGroup {
  int looks = 0;
  int down = 0;  // looks answered UNAVAILABLE before it serves
  uint64_t step = 0;
  GroupProbe probe() {
    return GroupProbe{[this](absl::Time) -> absl::StatusOr<bool> {
                        if (looks++ < down) return absl::UnavailableError("connection refused");
                        return true;
                      },
                      [this](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                        return SessionStep{step, /*running=*/false};
                      }};
  }
};

// Answers the statuses in order, then replies to step `step`.
struct Attempts {
  std::vector<absl::Status> failures;
  uint64_t step = 0;
  int calls = 0;
  absl::StatusOr<StepReply> operator()() {
    if (calls < static_cast<int>(failures.size())) return failures[calls++];
    ++calls;
    StepReply reply;
    reply.step = step;
    return reply;
  }
};

absl::StatusOr<StepReply> Restored(absl::Time = absl::InfiniteFuture()) {
  StepReply reply;
  reply.step = 99;  // marks the answer of `applied`
  return reply;
}

StepRecovery Recovery(absl::Duration timeout = absl::Seconds(10)) {
  return StepRecovery(timeout, [](absl::Duration) {});
}

TEST(StepRecoveryTest, AStepThatMeetsARecoveringGroupIsRedoneOnceTheGroupServes) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.down = 3, .step = 4};
  Attempts attempt{{absl::UnavailableError("Socket closed")}, 5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(attempt), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 5u);
  EXPECT_EQ(attempt.calls, 2);
  EXPECT_EQ(group.looks, 4);
}

TEST(StepRecoveryTest, AStepTheRestoredSessionAppliedAnswersItsRestoredResult) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 5};
  Attempts attempt{{absl::UnavailableError("reset"),
                    absl::FailedPreconditionError("step 5 out of sequence; expected step 6")},
                   5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(attempt), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 99u);
}

// A session past the step sent, once the group serves again, runs another timeline (a restart
// restored checkpoints that a Load had left): every step needs this trainer, so none past its
// own can be applied for it. Answered FAILED_PRECONDITION naming both steps, never as applied
// (before, it answered the other timeline's parameters as the step's).
TEST(StepRecoveryTest, ASessionPastTheStepSentIsAnErrorNotTheStepApplied) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.down = 1, .step = 500};
  Attempts attempt{{absl::UnavailableError("reset"),
                    absl::FailedPreconditionError("step 305 out of sequence; expected step 501")},
                   305};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 305, group.probe(), std::ref(attempt), Restored);
  EXPECT_THAT(reply.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "at step 500, past step 305"));
  EXPECT_EQ(attempt.calls, 1);
}

TEST(StepRecoveryTest, ASessionRestoredFurtherBackAnswersAbortedWithTheRestoredStep) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.down = 1, .step = 2};
  Attempts attempt{{absl::UnavailableError("reset")}, 5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(attempt), Restored);
  EXPECT_THAT(reply.status(), StatusIs(absl::StatusCode::kAborted,
                                       "session 's' was restored to step 2 while step 5 ran"));
  EXPECT_THAT(RewindStep(reply.status()), Optional(2u));
  EXPECT_EQ(attempt.calls, 1);
}

// Trainers 0 and 1 of session "s", sharing `recovery`, each apply step 4 on `group`.
void BothTrainersApplyStepFour(StepRecovery& recovery, FakeGroup& group) {
  for (uint32_t trainer : {0u, 1u}) {
    Attempts applied{{}, 4};
    ASSERT_THAT(recovery.Run("s", trainer, 4, group.probe(), std::ref(applied), Restored).status(),
                IsOk());
  }
}

// Two trainers of one session share the client (two threads): the first one's rewind does not
// make the second's out-of-sequence step look like its own mistake. Keyed by session alone, the
// second trainer got FAILED_PRECONDITION for every later step, and the first one's redone steps
// waited for it.
TEST(StepRecoveryTest, EachTrainerOfASharedClientIsToldOfTheRewind) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 4};
  ASSERT_NO_FATAL_FAILURE(BothTrainersApplyStepFour(recovery, group));
  group.step = 2;  // the group came back at step 2 between two steps
  for (uint32_t trainer : {0u, 1u}) {
    Attempts next{{absl::FailedPreconditionError("step 5 out of sequence; expected step 3")}, 5};
    absl::StatusOr<StepReply> rewound =
        recovery.Run("s", trainer, 5, group.probe(), std::ref(next), Restored);
    EXPECT_THAT(RewindStep(rewound.status()), Optional(2u)) << "trainer " << trainer;
  }
}

// One trainer learned of the restore itself (a pull after its step broke) and restarts its own
// record: the other trainer sharing the client is still told of the rewind. Before, a restart
// reset every trainer's, and the other's next step failed out of sequence as its own mistake.
TEST(StepRecoveryTest, ARestartForOneTrainerLeavesTheOthersToBeToldOfTheRewind) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 4};
  ASSERT_NO_FATAL_FAILURE(BothTrainersApplyStepFour(recovery, group));
  group.step = 2;
  recovery.Restart("s", 2, /*trainer_id=*/0);
  Attempts next{{absl::FailedPreconditionError("step 5 out of sequence; expected step 3")}, 5};
  absl::StatusOr<StepReply> rewound =
      recovery.Run("s", 1, 5, group.probe(), std::ref(next), Restored);
  EXPECT_THAT(RewindStep(rewound.status()), Optional(2u));
}

// Step 5's refusal as a restored session answers it: out of sequence, expecting step 6.
absl::Status NotReplayable() {
  return WithPayloadNumber(absl::FailedPreconditionError("step 5 out of sequence; expected step 6"),
                           kExpectedStepPayload, 6);
}

// The group applied step 5 while it recovered, and the pull of its parameters failed for a
// recovering reason (a rank lost during it): the pull is tried again, and the step answered.
// Before, the pull's UNAVAILABLE reached the caller, though the step stood.
TEST(StepRecoveryTest, ThePullOfAStepAppliedWhileTheGroupRecoveredIsTriedAgain) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 5};
  int pulls = 0;
  auto applied = [&pulls](absl::Time) -> absl::StatusOr<StepReply> {
    if (pulls++ < 2) return absl::UnavailableError("pull: rank 1 is away");
    return Restored();
  };
  Attempts first{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(first), applied);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 99u);
  EXPECT_EQ(pulls, 3);
  // Refused for a reason that is no recovery's: the caller's error, at once.
  auto refused = [&pulls](absl::Time) -> absl::StatusOr<StepReply> {
    ++pulls;
    return absl::InvalidArgumentError("pull: param_id 7 out of range");
  };
  Attempts second{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  EXPECT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(second), refused).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "param_id 7"));
  EXPECT_EQ(pulls, 4);
}

// The pull of a step applied ends by the recovery's deadline (it is given the time left, and at
// least 30 s: the step stands): before, it ran for the whole stream timeout, so a pull that hung
// (packets lost without a reset) held the trainer long past the recovery_timeout it set.
TEST(StepRecoveryTest, ThePullOfAStepAppliedEndsByTheRecoverysDeadline) {
  StepRecovery recovery = Recovery(absl::Seconds(60));
  FakeGroup group{.step = 5};
  std::vector<absl::Time> bys;
  auto applied = [&bys](absl::Time by) -> absl::StatusOr<StepReply> {
    bys.push_back(by);
    if (bys.size() == 1) return absl::UnavailableError("pull: rank 1 is away");
    return Restored();
  };
  const absl::Time began = absl::Now();
  Attempts first{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  ASSERT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(first), applied).status(), IsOk());
  ASSERT_EQ(bys.size(), 2u);
  for (absl::Time by : bys) {
    EXPECT_LE(by, began + absl::Seconds(61));
    EXPECT_EQ(by, bys[0]) << "each pull gets the same deadline: the recovery's";
  }
  // Near the recovery's end (of a 5 s one), the pull still gets 30 s.
  StepRecovery short_recovery = Recovery(absl::Seconds(5));
  bys.clear();
  Attempts second{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  ASSERT_THAT(short_recovery.Run("s", 0, 5, group.probe(), std::ref(second), applied).status(),
              IsOk());
  ASSERT_EQ(bys.size(), 2u);
  EXPECT_GE(bys[0], absl::Now() + absl::Seconds(29));
}

// The pull tried again meanwhile answers the parameters of an earlier step: the group restarted
// and restored an older checkpoint while it was tried. A rewind to that step, not step 5's answer
// (before, the pull's values were answered as step 5's, and the trainer trained on them).
TEST(StepRecoveryTest, APullOfAStepAppliedThatAnswersAnEarlierStepIsARewind) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 5};
  int pulls = 0;
  auto applied = [&pulls](absl::Time) -> absl::StatusOr<StepReply> {
    if (pulls++ == 0) return absl::UnavailableError("pull: rank 0 is away");
    StepReply restored;
    restored.step = 4;
    return restored;
  };
  Attempts first{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(first), applied);
  EXPECT_THAT(RewindStep(reply.status()), Optional(4u));
}

// The group applied step 5, and the answer was lost past the recovery (the caller got the pull's
// error): the caller redoes step 5 and gets its parameters (the session is at it), rather than
// FAILED_PRECONDITION for ever. Step 5 sent again with other gradients, which a server that can
// still compare them refuses naming no expected step, stays the caller's error.
TEST(StepRecoveryTest, AStepAppliedWhoseAnswerWasLostIsAnsweredWhenRedone) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 5};
  auto lost = [](absl::Time) -> absl::StatusOr<StepReply> {
    return absl::InvalidArgumentError("pull: the caller gave up");
  };
  Attempts first{{absl::UnavailableError("reset"), NotReplayable()}, 5};
  EXPECT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(first), lost).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "gave up"));
  auto applied = [](absl::Time) -> absl::StatusOr<StepReply> { return Restored(); };
  Attempts again{{NotReplayable()}, 5};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 5, group.probe(), std::ref(again), applied);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 99u);

  const absl::Status other_gradients = absl::FailedPreconditionError(
      "step 5 of session 's' was already applied with a different contribution from trainer 0");
  Attempts other{{other_gradients}, 5};
  EXPECT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(other), applied).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "different contribution"));
}

TEST(StepRecoveryTest, OutOfSequenceBelowTheLastAppliedStepIsARewindAndAtItTheCallersError) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 3};
  Attempts applied{{}, 3};
  ASSERT_THAT(recovery.Run("s", 0, 3, group.probe(), std::ref(applied), Restored).status(), IsOk());
  // The group came back at step 1 between two steps.
  group.step = 1;
  Attempts next{{absl::FailedPreconditionError("step 4 out of sequence; expected step 2")}, 4};
  absl::StatusOr<StepReply> rewound =
      recovery.Run("s", 0, 4, group.probe(), std::ref(next), Restored);
  EXPECT_THAT(RewindStep(rewound.status()), Optional(1u));
  // Step 4 again, with the session at 1 as this client now knows: the caller's mistake.
  Attempts again{{absl::FailedPreconditionError("step 4 out of sequence; expected step 2")}, 4};
  absl::StatusOr<StepReply> refused =
      recovery.Run("s", 0, 4, group.probe(), std::ref(again), Restored);
  EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 2"));
  EXPECT_EQ(RewindStep(refused.status()), std::nullopt);
}

// The session's state replaced at step 1 (a Load of an earlier checkpoint) after this client saw
// step 3 applied: step 4 refused out of sequence is the caller's mistake, not a rewind. Before,
// the mark of step 3 stayed, and the refusal was taken for a restore of the group.
TEST(StepRecoveryTest, AStateReplacedAtAnEarlierStepIsNoRewindOfWhatWasSeenBefore) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 3};
  recovery.Note("s", 0, 3);
  recovery.Note("t", 0, 3);
  group.step = 1;
  recovery.Restart("s", 1);
  Attempts next{{absl::FailedPreconditionError("step 4 out of sequence; expected step 2")}, 4};
  absl::StatusOr<StepReply> refused =
      recovery.Run("s", 0, 4, group.probe(), std::ref(next), Restored);
  EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 2"));
  EXPECT_EQ(RewindStep(refused.status()), std::nullopt);
  // Another session's mark stays.
  Attempts other{{absl::FailedPreconditionError("step 4 out of sequence; expected step 2")}, 4};
  EXPECT_THAT(
      RewindStep(recovery.Run("t", 0, 4, group.probe(), std::ref(other), Restored).status()),
      Optional(1u));
}

// A group whose rank 0 serves, with the session's step read from `steps` in turn (the last one
// repeated, and running a step before it): a step still ending on the ranks after its
// parameters came back.
struct EndingGroup {
  std::vector<uint64_t> steps;
  size_t reads = 0;
  GroupProbe probe() {
    return GroupProbe{[](absl::Time) -> absl::StatusOr<bool> { return true; },
                      [this](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                        const size_t read = std::min(reads++, steps.size() - 1);
                        return SessionStep{steps[read], read + 1 < steps.size()};
                      }};
  }
};

// The trainer had step 3's parameters before the ranks ended it (they come back as each rank
// stepped its own, before the all-gather) and sent step 4 at once: out of sequence, then sent
// again in its turn, never a rewind. So is one that met a recovery while step 3 still ended.
TEST(StepRecoveryTest, AStepSentWhileTheLastOneStillEndsIsSentAgainInItsTurn) {
  StepRecovery recovery = Recovery();
  EndingGroup group{{3}};
  Attempts third{{}, 3};
  ASSERT_THAT(recovery.Run("s", 0, 3, group.probe(), std::ref(third), Restored).status(), IsOk());

  group = EndingGroup{{2, 2, 2, 3}};
  Attempts fourth{{absl::FailedPreconditionError("step 4 out of sequence; expected step 3")}, 4};
  absl::StatusOr<StepReply> reply =
      recovery.Run("s", 0, 4, group.probe(), std::ref(fourth), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 4u);
  EXPECT_EQ(fourth.calls, 2);
  EXPECT_EQ(group.reads, 4u);

  group = EndingGroup{{5}};
  Attempts fifth{{}, 5};
  ASSERT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(fifth), Restored).status(), IsOk());
  group = EndingGroup{{4, 4, 5}};
  Attempts sixth{{absl::UnavailableError("reset")}, 6};
  reply = recovery.Run("s", 0, 6, group.probe(), std::ref(sixth), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 6u);
  EXPECT_EQ(sixth.calls, 2);
  EXPECT_EQ(group.reads, 3u);
}

// A group restoring its sessions from their checkpoints makes each session again (at step 0)
// before it loads it, and rank 0 serves only once they are loaded: a step that meets such a
// session is out of sequence, which is waited out as a recovery, never taken for a rewind.
TEST(StepRecoveryTest, AStepThatMeetsASessionBeingRestoredWaitsForTheGroup) {
  StepRecovery recovery = Recovery();
  EndingGroup serving{{3}};
  Attempts third{{}, 3};
  ASSERT_THAT(recovery.Run("s", 0, 3, serving.probe(), std::ref(third), Restored).status(), IsOk());
  int looks = 0;
  GroupProbe restoring{[&](absl::Time) -> absl::StatusOr<bool> { return ++looks > 2; },
                       [&](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                         return SessionStep{looks > 2 ? 3u : 0u, false};
                       }};
  Attempts fourth{{absl::FailedPreconditionError("step 4 out of sequence; expected step 1")}, 4};
  absl::StatusOr<StepReply> reply = recovery.Run("s", 0, 4, restoring, std::ref(fourth), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 4u);
  EXPECT_EQ(fourth.calls, 2);
}

TEST(StepRecoveryTest, AGroupThatDoesNotComeBackAnswersTheErrorNamingTheTimeout) {
  StepRecovery recovery = Recovery(absl::Milliseconds(200));
  FakeGroup group{.down = 1 << 30};
  Attempts attempt{{absl::UnavailableError("connection refused")}, 1};
  EXPECT_THAT(recovery.Run("s", 0, 1, group.probe(), std::ref(attempt), Restored).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       "did not serve session 's' again within recovery_timeout 200ms"));
}

TEST(StepRecoveryTest, AStepThatFailsWhileTheGroupServesEndsWithTheTimeout) {
  // Rank 0 serves, but the step cannot be taken (a rank it cannot reach): it is tried again,
  // backing off, until the timeout, and not a moment after.
  StepRecovery recovery(absl::Milliseconds(200), [](absl::Duration d) { absl::SleepFor(d); });
  FakeGroup group{.step = 0};
  Attempts attempt{std::vector<absl::Status>(10000, absl::UnavailableError("rank 1 is away")), 1};
  EXPECT_THAT(recovery.Run("s", 0, 1, group.probe(), std::ref(attempt), Restored).status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       "rank 1 is away (the group serves session 's' again, but the step still "
                       "failed when recovery_timeout 200ms ran out)"));
  EXPECT_GE(attempt.calls, 2);
  EXPECT_LE(attempt.calls, 5);  // 50, 100, 200 ms apart
}

// Hosts that drop packets make every call wait its whole rpc_timeout: each probe is told the
// recovery's deadline and ends there, so that the step ends within recovery_timeout rather than
// minutes later.
TEST(StepRecoveryTest, ProbesEndByTheRecoveryDeadline) {
  StepRecovery recovery = Recovery(absl::Milliseconds(300));
  std::vector<absl::Time> deadlines;
  const auto silent = [&deadlines](absl::Time deadline) {
    deadlines.push_back(deadline);
    absl::SleepFor(std::min(deadline - absl::Now(), absl::Seconds(5)));
    return absl::DeadlineExceededError("no answer");
  };
  GroupProbe probe{[&](absl::Time deadline) -> absl::StatusOr<bool> { return silent(deadline); },
                   [&](absl::string_view, absl::Time deadline) -> absl::StatusOr<SessionStep> {
                     return silent(deadline);
                   }};
  Attempts attempt{{absl::UnavailableError("reset")}, 1};
  const absl::Time start = absl::Now();
  EXPECT_THAT(recovery.Run("s", 0, 1, probe, std::ref(attempt), Restored).status(),
              StatusIs(absl::StatusCode::kUnavailable, "within recovery_timeout 300ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_FALSE(deadlines.empty());
  for (absl::Time deadline : deadlines) EXPECT_LE(deadline, start + absl::Milliseconds(350));
}

// The same refusal for a step this client never saw applied (another client's, or lost before
// it was seen) is the caller's error, not an answer.
TEST(StepRecoveryTest, AnExpectedNextStepIsNoAnswerForAStepNotSeenApplied) {
  StepRecovery recovery = Recovery();
  FakeGroup group{.step = 5};
  Attempts attempt{{NotReplayable()}, 5};
  EXPECT_THAT(recovery.Run("s", 0, 5, group.probe(), std::ref(attempt), Restored).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 6"));
}

// While the session still ends the step before one this client saw applied, reads that fail
// until the deadline do not make the last step read look like a restore (a rewind the trainer
// would act on): the step's recovery ends with an error instead.
TEST(StepRecoveryTest, ReadsThatFailWhileAStepEndsAreNoRewind) {
  StepRecovery recovery = Recovery(absl::Milliseconds(200));
  Attempts applied{{}, 5};
  FakeGroup seen{.step = 5};
  ASSERT_THAT(recovery.Run("s", 0, 5, seen.probe(), std::ref(applied), Restored).status(), IsOk());
  int reads = 0;
  GroupProbe probe{[](absl::Time) -> absl::StatusOr<bool> { return true; },
                   [&reads](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                     if (reads++ == 0) return SessionStep{4, /*running=*/true};
                     absl::SleepFor(absl::Milliseconds(20));
                     return absl::UnavailableError("rank 0 is away again");
                   }};
  Attempts next{{absl::UnavailableError("reset")}, 6};
  absl::StatusOr<StepReply> reply = recovery.Run("s", 0, 6, probe, std::ref(next), Restored);
  EXPECT_FALSE(reply.ok());
  EXPECT_EQ(RewindStep(reply.status()), std::nullopt) << reply.status();
}

TEST(StepRecoveryTest, ASessionGoneFromAServingGroupAnswersTheStepsError) {
  StepRecovery recovery = Recovery();
  GroupProbe probe{[](absl::Time) -> absl::StatusOr<bool> { return true; },
                   [](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                     return absl::NotFoundError("session 's' not found");
                   }};
  Attempts attempt{{absl::UnavailableError("session closed while the step waited")}, 1};
  EXPECT_THAT(recovery.Run("s", 0, 1, probe, std::ref(attempt), Restored).status(),
              StatusIs(absl::StatusCode::kUnavailable, "session closed while the step waited"));
  EXPECT_EQ(attempt.calls, 1);
}

// A rank 0 process that has just started answers SERVING for a moment, before it knows its
// sessions (its health service starts serving): the session it does not know yet is no session
// gone, since rank 0 does not serve once asked again. The step is redone once it serves.
TEST(StepRecoveryTest, ASessionUnknownToARankJustStartedIsWaitedFor) {
  StepRecovery recovery = Recovery();
  int looks = 0;
  int reads = 0;
  GroupProbe probe{[&looks](absl::Time) -> absl::StatusOr<bool> { return ++looks != 2; },
                   [&reads](absl::string_view, absl::Time) -> absl::StatusOr<SessionStep> {
                     if (reads++ == 0) return absl::NotFoundError("session 's' not found");
                     return SessionStep{4, /*running=*/false};
                   }};
  Attempts attempt{{absl::UnavailableError("Socket closed")}, 5};
  absl::StatusOr<StepReply> reply = recovery.Run("s", 0, 5, probe, std::ref(attempt), Restored);
  ASSERT_THAT(reply.status(), IsOk());
  EXPECT_EQ(reply->step, 5u);
}

TEST(StepRecoveryTest, ZeroTimeoutAndOtherErrorsWhileServingAreAnsweredAtOnce) {
  FakeGroup group;
  StepRecovery off = Recovery(absl::ZeroDuration());
  Attempts unavailable{{absl::UnavailableError("down")}, 1};
  EXPECT_THAT(off.Run("s", 0, 1, group.probe(), std::ref(unavailable), Restored).status(),
              StatusIs(absl::StatusCode::kUnavailable, "down"));
  EXPECT_EQ(group.looks, 0);
  StepRecovery on = Recovery();
  Attempts aborted{{absl::AbortedError("redo the step")}, 1};
  EXPECT_THAT(on.Run("s", 0, 1, group.probe(), std::ref(aborted), Restored).status(),
              StatusIs(absl::StatusCode::kAborted, "redo the step"));
  EXPECT_EQ(aborted.calls, 1);
  EXPECT_EQ(RewindStep(absl::AbortedError("redo the step")), std::nullopt);
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
