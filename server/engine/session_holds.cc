#include "server/engine/session_holds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "server/engine/session.h"

namespace optstep {

// --- Holds ---

absl::StatusOr<uint64_t> SessionHolds::Hold(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&session_.mu_);
  OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
  return session_.gate_.Hold(token, lease);
}

absl::Status SessionHolds::Renew(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&session_.mu_);
  OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
  return session_.gate_.Renew(token, lease);
}

absl::StatusOr<uint64_t> SessionHolds::HoldWhenFree(uint64_t token, absl::Duration lease,
                                                    absl::Time until) {
  while (true) {
    session_.gate_.AwaitFree(token, until);
    absl::StatusOr<uint64_t> held = Hold(token, lease);
    if (held.ok() || !absl::IsAborted(held.status()) || absl::Now() >= until) return held;
  }
}

absl::StatusOr<HeldPoint> SessionHolds::Settle(uint64_t token, uint64_t target, absl::Time deadline,
                                               absl::Duration lease) {
  {
    absl::MutexLock lock(&session_.mu_);
    OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
    OPTSTEP_RETURN_IF_ERROR(session_.gate_.Raise(token, target, deadline, lease));
    // A resolution that another rank began must end here too: if no trainer has begun this
    // step on this rank, its step deadline starts now, so that the step is aborted everywhere in
    // time rather than leaving the other rank inside its collective.
    if (session_.gate_.started() < target) session_.book_.StartClock(absl::Now());
    session_.StartResolutionLocked(ResolutionKind::kApply);
  }
  OPTSTEP_RETURN_IF_ERROR(session_.gate_.AwaitSettled(token, target, deadline));
  absl::MutexLock lock(&session_.mu_);
  // Initial values taken before the hold are written on the coordinator outside the lock; the
  // operation reads the masters from its own thread, so it waits for them (new ones are refused
  // while it holds the session).
  if (!session_.mu_.AwaitWithDeadline(absl::Condition(&session_, &Session::NoInitWritesLocked),
                                      deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "session '", session_.id_, "': initial values were still being written on rank ",
        session_.rank(), " at the hold's deadline"));
  }
  OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
  OPTSTEP_ASSIGN_OR_RETURN(const uint64_t resolutions, session_.gate_.Settle(token));
  const StepCounters& counters = session_.book_.counters();
  return HeldPoint{resolutions, counters.step, counters.skipped_steps};
}

absl::Status SessionHolds::Release(uint64_t token) {
  absl::MutexLock lock(&session_.mu_);
  // A step whose contributions all arrived during the hold starts now.
  if (session_.gate_.Release(token)) session_.StartResolutionLocked(ResolutionKind::kApply);
  return absl::OkStatus();
}

void SessionHolds::ExpireHold(absl::Time now) {
  absl::MutexLock lock(&session_.mu_);
  if (session_.gate_.Expire(now)) session_.StartResolutionLocked(ResolutionKind::kApply);
}

absl::Status SessionHolds::CheckSettled(uint64_t token) const {
  absl::MutexLock lock(&session_.mu_);
  OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
  return session_.gate_.CheckSettled(token);
}

absl::StatusOr<std::vector<HeldTensor>> SessionHolds::HeldTensors(uint64_t token,
                                                                  const StateSelection& selection) {
  return SelectHeld(token, selection, /*to_read=*/false);
}

absl::StatusOr<std::vector<HeldTensor>> SessionHolds::HeldTensorsToRead(
    uint64_t token, const StateSelection& selection) {
  return SelectHeld(token, selection, /*to_read=*/true);
}

absl::StatusOr<std::vector<HeldTensor>> SessionHolds::SelectHeld(uint64_t token,
                                                                 const StateSelection& selection,
                                                                 bool to_read) {
  StepCounters counters;
  {
    absl::MutexLock lock(&session_.mu_);
    OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
    OPTSTEP_RETURN_IF_ERROR(session_.gate_.CheckSettled(token));
    counters = session_.book_.counters();
    if (to_read) OPTSTEP_RETURN_IF_ERROR(session_.CheckMastersAtStepLocked(counters.step));
  }
  return SelectState(*session_.replica_, selection, session_.shared_from_this(), counters);
}

absl::StatusOr<std::shared_ptr<const StateDict>> SessionHolds::ExportHeld(
    uint64_t token, const StateSelection& selection, absl::Duration lease) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> tensors, HeldTensorsToRead(token, selection));
  // A renewal refused (the hold is gone) ends the copy: a step may be writing the tensors.
  absl::StatusOr<std::shared_ptr<const StateDict>> copy =
      CopyStateToHost(tensors, [&]() -> absl::Status {
        return lease > absl::ZeroDuration() ? Renew(token, lease) : absl::OkStatus();
      });
  OPTSTEP_RETURN_IF_ERROR(copy.status());
  // Still held once copied: a hold whose lease passed while the tensors were read let a step
  // resolve meanwhile, and the copy may hold parts of two steps.
  OPTSTEP_RETURN_IF_ERROR(CheckSettled(token));
  return copy;
}

absl::Status SessionHolds::StageState(uint64_t token, std::shared_ptr<const StateDict> state,
                                      bool complete) {
  if (complete) {
    OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> expected,
                             HeldTensors(token, StateSelection{}));
    for (const HeldTensor& t : expected) {
      if (state->count(t.key) == 0) {
        return absl::DataLossError(absl::StrCat("session '", session_.id_, "' rank ",
                                                session_.rank(), ": the state lacks key '", t.key,
                                                "'"));
      }
    }
  } else {
    OPTSTEP_RETURN_IF_ERROR(CheckSettled(token));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<ResolvedState> resolved,
                           ResolveState(*session_.replica_, std::move(state)));
  absl::MutexLock lock(&session_.mu_);
  OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
  return session_.gate_.Stage(token, std::move(resolved));
}

absl::Status SessionHolds::ApplyStaged(uint64_t token) {
  std::shared_ptr<ResolvedState> staged;
  {
    absl::MutexLock lock(&session_.mu_);
    OPTSTEP_RETURN_IF_ERROR(session_.book_.CheckUsable());
    OPTSTEP_ASSIGN_OR_RETURN(staged, session_.gate_.TakeStaged(token));
  }
  // On the coordinator, so that no snapshot reads the masters while they are replaced.
  absl::Notification done;
  absl::Status status;
  std::vector<StepCallback> aborted;
  session_.coordinator_->Post([&] {
    {
      absl::MutexLock lock(&session_.mu_);
      ++session_.state_writes_;  // read by the checks of initial values (CheckInitTakenLocked)
    }
    status = session_.coordinator_->OnDevice(
        [&] { return WriteResolvedState(*session_.replica_, *staged); });
    // The predecessor's state changed on its rank, not here: this shadow is stale until a heal
    // imports it again.
    if (status.ok() && session_.shadow_ != nullptr) {
      session_.shadow_->Invalidate(absl::FailedPreconditionError(
          absl::StrCat("session '", session_.id_, "': rank ", session_.rank(),
                       "'s shadow is stale after a state import")));
    }
    absl::MutexLock lock(&session_.mu_);
    --session_.state_writes_;
    if (status.ok()) {
      session_.book_.WriteCounters(*staged);
      ++session_.state_replacements_;
      // An import of a part of the state (ImportStateDict of some keys) leaves the masters it
      // did not write as they were: a peer's of a step ahead are still not this step's.
      if (staged->every_master) session_.masters_ahead_to_.reset();
      session_.replaced_to_.push_back(session_.book_.counters().step);
      if (session_.replaced_to_.size() > Session::kKeptReplacements) {
        const uint64_t let_go = session_.replaced_to_.front();
        session_.lowest_let_go_ = std::min(session_.lowest_let_go_.value_or(let_go), let_go);
        session_.replaced_to_.pop_front();
      }
      aborted = session_.book_.Abort();
    }
    done.Notify();
  });
  done.WaitForNotification();
  const absl::Status reason = absl::AbortedError(
      absl::StrCat("session '", session_.id_,
                   "': the state was replaced (checkpoint load or state dict import) "
                   "while this step was pending; redo it from the restored step"));
  for (StepCallback& callback : aborted) callback(reason);
  return status;
}

// --- One rank, between steps ---

absl::Status SessionHolds::CheckOneRank(absl::string_view verb, absl::string_view held) const {
  const int world = session_.layout().world_size;
  if (world <= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("session '", session_.id_, "' spans ", world, " ranks; ", verb,
                   " its state through a hold (Session::holds(): Hold / ", held, ")"));
}

void SessionHolds::ExportState(
    std::vector<uint32_t> model_chunks,
    std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)> done) {
  if (absl::Status one = CheckOneRank("export", "ExportHeld"); !one.ok()) return done(one);
  // On the coordinator, between steps, so that the values are those of one step.
  session_.coordinator_->Post([self = session_.shared_from_this(), chunks = std::move(model_chunks),
                               done = std::move(done)] {
    StateSelection selection;
    selection.model_chunks = chunks;
    StepCounters counters;
    {
      absl::MutexLock lock(&self->mu_);
      counters = self->book_.counters();
    }
    absl::StatusOr<std::shared_ptr<const StateDict>> dict;
    absl::Status status = self->coordinator_->OnDevice([&] {
      dict = CopyStateToHost(SelectState(*self->replica_, selection, self, counters));
      return dict.status();
    });
    done(status.ok() ? std::move(dict) : status);
  });
}

void SessionHolds::ImportState(std::shared_ptr<const StateDict> state,
                               std::function<void(absl::Status)> done) {
  if (absl::Status one = CheckOneRank("import", "StageState"); !one.ok()) return done(one);
  session_.coordinator_->Post([self = session_.shared_from_this(), state = std::move(state),
                               done = std::move(done)] {
    absl::Status refused;
    {
      absl::MutexLock lock(&self->mu_);
      if (!self->book_.between_steps() || self->gate_.held()) {
        refused = absl::FailedPreconditionError(
            absl::StrCat("session '", self->id_, "': step ", self->book_.counters().step + 1,
                         " is pending or the session is held; import a state dict between steps"));
      } else {
        self->book_.set_running(true);  // no step starts while the state is replaced
      }
    }
    if (!refused.ok()) return done(refused);  // told without the lock, as every callback
    absl::StatusOr<std::shared_ptr<ResolvedState>> resolved = ResolveState(*self->replica_, state);
    absl::Status status = resolved.status();
    if (resolved.ok()) {
      status = self->coordinator_->OnDevice(
          [&] { return WriteResolvedState(*self->replica_, **resolved); });
    }
    {
      absl::MutexLock lock(&self->mu_);
      if (status.ok()) self->book_.WriteCounters(**resolved);
      self->book_.set_running(false);
    }
    done(status);
  });
}

}  // namespace optstep
