#include "client/cpp/step_recovery.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/status_payload.h"

namespace optstep {

std::optional<uint64_t> RewindStep(const absl::Status& status) {
  return PayloadNumber(status, absl::StatusCode::kAborted, kRewindPayload);
}

namespace client_internal {
namespace {

constexpr absl::Duration kFirstWait = absl::Milliseconds(50);
constexpr absl::Duration kLongestWait = absl::Seconds(1);

absl::Duration Doubled(absl::Duration wait) { return std::min(2 * wait, kLongestWait); }

// How long a session may take to reach the step a client saw applied: from a server of an earlier
// release, a step's parameters could come back as each rank had stepped its own, before the
// ranks' all-gather ended it (a rank's stream now ends only once the step ended on it).
constexpr absl::Duration kStepEndWait = absl::Seconds(30);
// The least time the pull of a step the session applied gets, whatever is left of the recovery:
// the step stands, and the recovery's last moments must not make it an error.
constexpr absl::Duration kLeastAppliedPull = absl::Seconds(30);
constexpr absl::Duration kFirstStepEndPoll = absl::Milliseconds(5);
constexpr absl::Duration kLongestStepEndPoll = absl::Milliseconds(100);

}  // namespace

StepRecovery::StepRecovery(absl::Duration timeout, std::function<void(absl::Duration)> sleep)
    : timeout_(timeout), sleep_(std::move(sleep)) {}

absl::Status StepRecovery::RunWhileUnavailable(absl::FunctionRef<absl::Status()> attempt) const {
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Duration wait = kFirstWait;
  for (;;) {
    const absl::Status status = attempt();
    if (!absl::IsUnavailable(status) || absl::Now() + wait > deadline) return status;
    sleep_(wait);
    wait = Doubled(wait);
  }
}

absl::StatusOr<StepReply> StepRecovery::Run(
    absl::string_view session_id, uint32_t trainer_id, uint64_t step, const GroupProbe& probe,
    absl::FunctionRef<absl::StatusOr<StepReply>()> attempt,
    absl::FunctionRef<absl::StatusOr<StepReply>(absl::Time)> applied) {
  if (timeout_ <= absl::ZeroDuration()) return attempt();
  const TrainerKey key(session_id, trainer_id);
  std::optional<absl::Time> deadline;
  absl::Duration wait = kFirstWait;
  bool was_applied = false;
  bool retried_in_turn = false;
  // Every probe ends by the recovery's deadline, or, before a recovery began, by when it would.
  const auto probes_by = [&] { return deadline.value_or(absl::Now() + timeout_); };
  while (true) {
    absl::StatusOr<StepReply> reply = attempt();
    if (reply.ok()) {
      Note(session_id, trainer_id, step);
      return reply;
    }
    const absl::Status error = reply.status();
    // Out of sequence while rank 0 does not serve: a session that the group is restoring (made
    // again, its checkpoint not yet loaded) is waited for below.
    if (error.code() == absl::StatusCode::kFailedPrecondition && !NotServing(probe, probes_by())) {
      // Out of sequence: the last step is still ending on the ranks, the session's step moved
      // back, or the applied step is not replayable after a restore, or a mistake of the caller.
      absl::StatusOr<SessionStep> read = probe.session_step(session_id, probes_by());
      if (!read.ok()) return error;
      const bool ending = read->running && read->step < AppliedStep(key);
      absl::StatusOr<uint64_t> seen =
          AwaitSeenStep(probe, key.first, AppliedStep(key), *read, probes_by());
      if (!seen.ok()) return error;
      const uint64_t now = *seen;
      if (now < AppliedStep(key)) return Rewind(key, now, step);
      // Applied while the group recovered; or applied and seen so before, and redone because
      // its answer was lost (the pull of its parameters failed): the session, restored since,
      // is at it and expects the next one. (A refusal of other gradients names no step.)
      const bool answer_lost = AppliedStep(key) >= step && now == step &&
                               PayloadNumber(error, absl::StatusCode::kFailedPrecondition,
                                             kExpectedStepPayload) == step + 1;
      if ((was_applied && now == step) || answer_lost) {
        Note(session_id, trainer_id, step);
        return AppliedBy(key, step, probe, applied, probes_by());
      }
      // The last step ended meanwhile: this one's turn (once; then the caller's error).
      if (ending && now + 1 == step && !retried_in_turn) {
        retried_in_turn = true;
        continue;
      }
      return error;
    }
    // The recovery's time counts from its first error, the probe that tells it one included.
    const absl::Time by = probes_by();
    if (!Recovering(probe, error, by)) return error;
    if (!deadline) {
      deadline = by;
    } else if (absl::Now() >= *deadline) {
      // Rank 0 serves the session again, yet the step still fails (a rank it cannot reach).
      return absl::Status(error.code(),
                          absl::StrCat(error.message(), " (the group serves session '", session_id,
                                       "' again, but the step still failed when recovery_timeout ",
                                       absl::FormatDuration(timeout_), " ran out)"));
    }
    absl::StatusOr<SessionStep> read = AwaitGroup(probe, session_id, *deadline, &wait, error);
    if (!read.ok()) return read.status();
    absl::StatusOr<uint64_t> seen =
        AwaitSeenStep(probe, key.first, AppliedStep(key), *read, *deadline);
    if (!seen.ok()) return seen.status();
    const uint64_t now = *seen;
    wait = Doubled(wait);
    if (now > step) {
      // Every step needs this trainer's gradients: a session past the one it sends runs another
      // timeline (a restart restored checkpoints that a Load or an import had left), and none of
      // its steps is this trainer's.
      return absl::FailedPreconditionError(
          absl::StrCat("session '", session_id, "' is at step ", now, ", past step ", step,
                       " that trainer ", trainer_id,
                       " sends: none of its steps is this trainer's (its state was likely "
                       "replaced by another timeline while the group recovered, or another "
                       "process sends as this trainer); load the state to go on from, and rewind "
                       "to it"));
    }
    if (now + 1 < step) {
      // Out of sequence while rank 0 did not serve, and the session is not behind a step this
      // client saw applied: the caller's own mistake, not a restore.
      if (error.code() == absl::StatusCode::kFailedPrecondition && now >= AppliedStep(key)) {
        return error;
      }
      return Rewind(key, now, step);
    }
    was_applied = now == step;
  }
}

absl::StatusOr<StepReply> StepRecovery::AppliedBy(
    const TrainerKey& key, uint64_t step, const GroupProbe& probe,
    absl::FunctionRef<absl::StatusOr<StepReply>(absl::Time)> applied, absl::Time by) {
  absl::Duration wait = kFirstWait;
  while (true) {
    // Within the recovery's deadline (a pull that hangs, packets lost without a reset, would
    // otherwise hold the trainer for the stream timeout), but never less than kLeastAppliedPull.
    absl::StatusOr<StepReply> reply = applied(std::max(by, absl::Now() + kLeastAppliedPull));
    // Parameters of an earlier step: the group was restored meanwhile (the pull was tried again
    // through its restart).
    if (reply.ok() && reply->step < step) return Rewind(key, reply->step, step);
    if (reply.ok()) return reply;
    if (absl::Now() >= by || !Recovering(probe, reply.status(), by)) {
      return absl::Status(reply.status().code(),
                          absl::StrCat("step ", step, " of session '", key.first,
                                       "' was applied, but its parameters were not pulled: ",
                                       reply.status().message()));
    }
    sleep_(std::min(wait, std::max(absl::ZeroDuration(), by - absl::Now())));
    wait = Doubled(wait);
  }
}

bool StepRecovery::Recovering(const GroupProbe& probe, const absl::Status& error,
                              absl::Time by) const {
  switch (error.code()) {
    case absl::StatusCode::kUnavailable:
      return true;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return NotServing(probe, by);
    default:
      return false;
  }
}

bool StepRecovery::NotServing(const GroupProbe& probe, absl::Time by) const {
  // Unreachable: recovering; no health service (not a server group): not.
  absl::StatusOr<bool> serving = probe.serving(by);
  if (serving.ok()) return !*serving;
  return serving.status().code() == absl::StatusCode::kUnavailable ||
         serving.status().code() == absl::StatusCode::kDeadlineExceeded;
}

absl::StatusOr<SessionStep> StepRecovery::AwaitGroup(const GroupProbe& probe,
                                                     absl::string_view session_id,
                                                     absl::Time deadline, absl::Duration* wait,
                                                     const absl::Status& error) const {
  while (true) {
    sleep_(std::min(*wait, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    absl::StatusOr<bool> serving = probe.serving(deadline);
    if (serving.ok() && *serving) {
      absl::StatusOr<SessionStep> now = probe.session_step(session_id, deadline);
      if (now.ok()) return now;
      // Serving without the session (closed, or not restored): the step's own error. Unless
      // rank 0 no longer serves once asked again: a process that has just started answers
      // SERVING for a moment, before it knows its sessions.
      if (now.status().code() == absl::StatusCode::kNotFound) {
        absl::StatusOr<bool> still = probe.serving(deadline);
        if (still.ok() && *still) return error;
      }
    }
    if (absl::Now() >= deadline) {
      return absl::Status(
          error.code(),
          absl::StrCat(error.message(), " (the group did not serve session '", session_id,
                       "' again within recovery_timeout ", absl::FormatDuration(timeout_), ")"));
    }
    *wait = Doubled(*wait);
  }
}

absl::StatusOr<uint64_t> StepRecovery::AwaitSeenStep(const GroupProbe& probe,
                                                     const std::string& session_id, uint64_t seen,
                                                     SessionStep now, absl::Time by) {
  absl::Duration poll = kFirstStepEndPoll;
  for (absl::Duration waited; now.running && now.step < seen && waited < kStepEndWait;
       waited += poll) {
    // Not past the recovery's deadline: a step still ending then is not taken for a restore.
    if (absl::Now() >= by) {
      return absl::DeadlineExceededError(
          absl::StrCat("session '", session_id, "' was still ending the step before step ", seen,
                       " when recovery_timeout ", absl::FormatDuration(timeout_), " ran out"));
    }
    sleep_(poll);
    poll = std::min(2 * poll, kLongestStepEndPoll);
    OPTSTEP_ASSIGN_OR_RETURN(now, probe.session_step(session_id, by));
  }
  return now.step;
}

void StepRecovery::Note(absl::string_view session_id, uint32_t trainer_id, uint64_t step) {
  absl::MutexLock lock(&mu_);
  uint64_t& applied = applied_[TrainerKey(session_id, trainer_id)];
  applied = std::max(applied, step);
}

void StepRecovery::Restart(absl::string_view session_id, uint64_t step,
                           std::optional<uint32_t> trainer_id) {
  absl::MutexLock lock(&mu_);
  if (trainer_id.has_value()) {
    applied_[TrainerKey(std::string(session_id), *trainer_id)] = step;
    return;
  }
  for (auto& [key, applied] : applied_) {
    if (key.first == session_id) applied = step;
  }
}

uint64_t StepRecovery::AppliedStep(const TrainerKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = applied_.find(key);
  return it == applied_.end() ? 0 : it->second;
}

absl::Status StepRecovery::Rewind(const TrainerKey& key, uint64_t restored, uint64_t step) {
  const std::string& session_id = key.first;
  {
    absl::MutexLock lock(&mu_);
    applied_[key] = restored;
  }
  absl::Status status = absl::AbortedError(absl::StrCat(
      "session '", session_id, "' was restored to step ", restored, " while step ", step,
      " ran; rewind the training data to step ", restored + 1, " and go on from there"));
  status.SetPayload(kRewindPayload, absl::Cord(absl::StrCat(restored)));
  return status;
}

}  // namespace client_internal
}  // namespace optstep
