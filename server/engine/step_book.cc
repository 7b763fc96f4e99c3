#include "server/engine/step_book.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_payload.h"

namespace optstep {
namespace {

// Where a contribution sent again differs from the one recorded: the first group whose schedule
// differs, else the gradient bytes (empty when neither does).
std::string Difference(const StepSchedule& recorded, const StepSchedule& resent) {
  for (size_t g = 0; g < recorded.size() && g < resent.size(); ++g) {
    if (recorded[g] != resent[g]) {
      return absl::StrCat("group ", g, " lr ", resent[g].lr, ", weight_decay ",
                          resent[g].weight_decay, " where it sent lr ", recorded[g].lr,
                          ", weight_decay ", recorded[g].weight_decay);
    }
  }
  return "";
}

}  // namespace

StepBook::StepBook(std::string session_id, int rank, const SessionConfig& config,
                   std::vector<int64_t> owned_numels, const std::vector<std::string>* names)
    : id_(std::move(session_id)),
      rank_(rank),
      contributions_(config.mode, config.num_trainers, owned_numels, names),
      order_(config.num_trainers, owned_numels),
      statistics_(static_cast<int>(owned_numels.size())),
      attempts_(config.num_trainers, 0),
      began_(config.num_trainers, false),
      applied_digests_(config.num_trainers) {}

absl::Status StepBook::CheckUsable() const {
  if (closed_) return absl::UnavailableError(absl::StrCat("session '", id_, "' is closed"));
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank_,
                                               " lost a peer; the group must be restarted"));
  }
  if (interrupted_) {
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank_,
                                               " lost a peer during step ", *interrupted_,
                                               "; the step is taken again once the group heals"));
  }
  return absl::OkStatus();
}

absl::Status StepBook::CheckFresh(const StepHandle& c) const {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  const bool stale = c.generation != generation_ && !AppliedSinceRetry(c);
  if (stale || (!c.retry && !c.replay && c.attempt != attempts_[c.trainer])) {
    return absl::AbortedError(absl::StrCat("session '", id_, "': step ", c.step, " of trainer ",
                                           c.trainer, " was aborted or superseded; redo the step"));
  }
  return absl::OkStatus();
}

bool StepBook::AppliedSinceRetry(const StepHandle& c) const {
  return c.retry && c.generation != generation_ && counters_.step == c.step &&
         last_outcome_.has_value();
}

absl::StatusOr<StepHandle> StepBook::Begin(const StepBegin& begin, StepSchedule schedule,
                                           absl::Time now, std::vector<WaitingChunk>* superseded) {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  StepHandle c;
  c.trainer = begin.trainer;
  c.step = begin.step;
  c.return_dtype = begin.return_dtype;
  c.return_params = begin.return_params;
  c.stream_params = begin.stream_params;
  c.return_owned = begin.return_owned;
  c.generation = generation_;
  const uint64_t step = counters_.step;
  if (begin.step == step && step > 0 && last_outcome_) {
    OPTSTEP_RETURN_IF_ERROR(
        DifferentContribution(c, "applied", Difference(applied_schedule_, schedule)));
    c.replay = true;
    c.resent = std::make_shared<ContributionDigest>();
    return c;
  }
  if (begin.step != step + 1) {
    return WithPayloadNumber(
        absl::FailedPreconditionError(absl::StrCat("session '", id_, "': step ", begin.step,
                                                   " out of sequence; expected step ", step + 1)),
        kExpectedStepPayload, step + 1);
  }
  if (interrupted_commit_ && interrupted_commit_->step == begin.step) {
    absl::Status same = DifferentContribution(c, "committed before a lost peer interrupted it",
                                              Difference(interrupted_commit_->schedule, schedule));
    if (!same.ok()) {
      // The step's deadline runs from this redo, as from any: if the one committed never comes,
      // the step ends unapplied at it and the record lapses (EndStep).
      StartClock(now);
      return same;
    }
  }
  if (running_ || contributions_.committed(begin.trainer)) {
    if (schedule_ && contributions_.committed(begin.trainer)) {
      OPTSTEP_RETURN_IF_ERROR(
          DifferentContribution(c, "committed", Difference(*schedule_, schedule)));
    }
    c.retry = true;
    c.resent = std::make_shared<ContributionDigest>();
    return c;
  }
  if (schedule_) {
    OPTSTEP_RETURN_IF_ERROR(CheckSameSchedule(begin.step, begin.trainer, schedule, *schedule_));
  }
  schedule_ = std::move(schedule);
  StartClock(now);
  contributions_.DropTrainer(begin.trainer);
  for (WaitingChunk& chunk : order_.TakeWaiting(begin.trainer)) {
    superseded->push_back(std::move(chunk));
  }
  began_[begin.trainer] = true;
  c.attempt = ++attempts_[begin.trainer];
  return c;
}

absl::Status StepBook::Commit(const StepHandle& c, uint64_t num_elements, StepCallback done) {
  if (!c.retry) {
    const int64_t received = contributions_.elements_from(c.trainer);
    if (num_elements != 0 && static_cast<int64_t>(num_elements) != received) {
      contributions_.DropTrainer(c.trainer);
      return absl::InvalidArgumentError(absl::StrCat("step ", c.step, ": trainer ", c.trainer,
                                                     " commits ", num_elements,
                                                     " elements but sent ", received));
    }
    absl::Status complete = contributions_.CheckTrainerComplete(c.trainer);
    if (complete.ok() && !contributions_.SameResend(c.trainer)) {
      complete = absl::FailedPreconditionError(absl::StrCat(
          "session '", id_, "': step ", c.step, ": trainer ", c.trainer,
          " resent elements it had sent before with other values; the step sums what it sent "
          "first: begin the step again and resend the same gradient"));
    }
    if (complete.ok() && interrupted_commit_ && interrupted_commit_->step == c.step &&
        !contributions_.digest(c.trainer).SameAs(interrupted_commit_->digests[c.trainer])) {
      complete = DifferentContribution(
          c, "committed before a lost peer interrupted it",
          "other gradient bytes; resend what was committed, or the step is taken with other "
          "bytes only once a redo ends unapplied at its deadline");
    }
    if (complete.ok()) {
      contributions_.Commit(c.trainer);
      if (contributions_.all_committed()) complete = contributions_.CheckAllComplete();
    }
    if (!complete.ok()) {
      contributions_.DropTrainer(c.trainer);
      return complete;
    }
  }
  waiters_.push_back(StepWaiter{c.return_dtype, c.return_params, std::move(done), c.stream_params,
                                c.return_owned, c.trainer});
  return absl::OkStatus();
}

std::vector<StepCallback> StepBook::TakeWaitersOf(int trainer) {
  auto theirs =
      std::stable_partition(waiters_.begin(), waiters_.end(),
                            [trainer](const StepWaiter& w) { return w.trainer != trainer; });
  std::vector<StepCallback> taken;
  for (auto it = theirs; it != waiters_.end(); ++it) taken.push_back(std::move(it->done));
  waiters_.erase(theirs, waiters_.end());
  return taken;
}

absl::Status StepBook::CheckResent(const StepHandle& c) const {
  if (c.replay) {
    return applied_digests_[c.trainer].SameAs(*c.resent)
               ? absl::OkStatus()
               : DifferentContribution(c, "applied", "other gradient bytes");
  }
  // A retry while a resolution runs, from a trainer that did not commit: nothing to compare; the
  // step it waits for cannot include it.
  if (!contributions_.committed(c.trainer)) return absl::OkStatus();
  return contributions_.digest(c.trainer).SameAs(*c.resent)
             ? absl::OkStatus()
             : DifferentContribution(c, "committed", "other gradient bytes");
}

void StepBook::MarkInterrupted(uint64_t step) {
  interrupted_ = step;
  if (!schedule_ || !contributions_.all_committed()) return;  // not applied anywhere
  CommittedStep committed{step, *schedule_, {}};
  for (int t = 0; t < static_cast<int>(began_.size()); ++t) {
    committed.digests.push_back(contributions_.digest(t));
  }
  interrupted_commit_ = std::move(committed);
}

absl::Status StepBook::DifferentContribution(const StepHandle& c, absl::string_view done,
                                             const std::string& difference) const {
  if (difference.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", c.step, " of session '", id_, "' was already ", done,
      " with a different contribution from trainer ", c.trainer, " (this one has ", difference,
      "); a step is applied once, with the contribution sent first: nothing of this one was "
      "applied"));
}

bool StepBook::ready_to_apply() const {
  return !closed_ && !broken_ && !interrupted_ && !running_ && contributions_.all_committed();
}

StepLedger::Pending StepBook::pending() const {
  StepLedger::Pending pending{counters_.step + 1, schedule_, step_began_};
  pending.num_trainers = static_cast<int>(began_.size());
  for (int t = 0; t < pending.num_trainers; ++t) {
    if (contributions_.committed(t)) continue;
    pending.uncommitted.push_back(t);
    if (!began_[t]) pending.not_begun.push_back(t);
  }
  return pending;
}

std::vector<StepWaiter> StepBook::TakeStreamingWaiters() {
  auto wants = std::stable_partition(waiters_.begin(), waiters_.end(), [](const StepWaiter& w) {
    return !(w.want_params && w.stream);
  });
  std::vector<StepWaiter> early(std::make_move_iterator(wants),
                                std::make_move_iterator(waiters_.end()));
  waiters_.erase(wants, waiters_.end());
  return early;
}

StepLedger::Ended StepBook::EndStep(absl::StatusOr<StepOutcome>& outcome,
                                    std::vector<WaitingChunk>* stranded) {
  StepLedger::Ended ended;
  ended.waiters = std::move(waiters_);
  waiters_.clear();
  if (outcome.ok()) {
    ++counters_.step;
    if (outcome->skipped) ++counters_.skipped_steps;
    outcome->step = counters_.step;
    last_outcome_ = *outcome;
    interrupted_commit_.reset();
    if (schedule_) applied_schedule_ = *schedule_;
    for (size_t t = 0; t < applied_digests_.size(); ++t) {
      applied_digests_[t] = contributions_.digest(static_cast<int>(t));
    }
  }
  // A redo of an interrupted step that ended without being applied (aborted at its deadline: a
  // trainer that cannot bring what it committed before, having computed the step again) lets
  // the record lapse, so that the session goes on rather than refuse every redo for ever.
  if (!outcome.ok() && !interrupted_) interrupted_commit_.reset();
  ended.step = outcome.ok() ? counters_.step : counters_.step + 1;
  for (WaitingChunk& chunk : ResetStep()) stranded->push_back(std::move(chunk));
  snapshots_.clear();
  return ended;
}

std::vector<StepCallback> StepBook::Abort() {
  std::vector<StepCallback> callbacks;
  for (WaitingChunk& chunk : ResetStep()) {
    callbacks.push_back([added = std::move(chunk.added)](absl::StatusOr<StepOutcome> outcome) {
      added(outcome.status());  // only ever told why the step ended
    });
  }
  for (StepWaiter& w : waiters_) callbacks.push_back(std::move(w.done));
  waiters_.clear();
  return callbacks;
}

void StepBook::WriteCounters(const ResolvedState& resolved) {
  if (resolved.step) counters_.step = *resolved.step;
  if (resolved.skipped_steps) counters_.skipped_steps = *resolved.skipped_steps;
  // A step interrupted here that the state written has applied (a heal's catch-up) is not redone.
  if (interrupted_ && *interrupted_ <= counters_.step) interrupted_.reset();
  snapshots_.clear();
  last_outcome_.reset();
  interrupted_commit_.reset();
  applied_digests_.assign(applied_digests_.size(), ContributionDigest());
  statistics_.Reset();
  ++generation_;
}

bool StepBook::Close() {
  if (closed_) return false;
  closed_ = true;
  return true;
}

void StepBook::MarkBroken() { broken_ = true; }

void StepBook::StartClock(absl::Time now) {
  if (!step_began_) step_began_ = now;
}

void StepBook::RestartClock(absl::Time now) {
  if (step_began_) step_began_ = now;
}

std::vector<WaitingChunk> StepBook::ResetStep() {
  ++generation_;
  contributions_.Reset();
  statistics_.Reset();
  schedule_.reset();
  step_began_.reset();
  began_.assign(began_.size(), false);
  return order_.Reset();
}

}  // namespace optstep
