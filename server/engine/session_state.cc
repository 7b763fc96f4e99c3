// Session: the state dict between steps (ExportState / ImportState, one rank) and under a hold
// (every rank settled at the same resolution: HeldTensors, ExportHeld, StageState, ApplyStaged).
// The tensors are the ReplicaState's; the hold is the ResolutionGate's.

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "server/engine/session.h"

namespace optstep {

// --- Holds ---

absl::StatusOr<uint64_t> Session::Hold(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  return gate_.Hold(token, lease);
}

absl::StatusOr<HeldPoint> Session::Settle(uint64_t token, uint64_t target, absl::Time deadline,
                                          absl::Duration lease) {
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckUsable());
    OPTSTEP_RETURN_IF_ERROR(gate_.Raise(token, target, deadline, lease));
    // A resolution that another rank began must end here too: if no trainer has begun this
    // step on this rank, its step deadline starts now, so that the step is aborted everywhere in
    // time rather than leaving the other rank inside its collective.
    if (gate_.started() < target && !step_began_) step_began_ = absl::Now();
    StartIfCompleteLocked();
  }
  OPTSTEP_RETURN_IF_ERROR(gate_.AwaitSettled(token, target, deadline));
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  OPTSTEP_ASSIGN_OR_RETURN(const uint64_t resolutions, gate_.Settle(token));
  return HeldPoint{resolutions, counters_.step, counters_.skipped_steps};
}

absl::Status Session::Release(uint64_t token) {
  absl::MutexLock lock(&mu_);
  // A step whose contributions all arrived during the hold starts now.
  if (gate_.Release(token)) StartIfCompleteLocked();
  return absl::OkStatus();
}

void Session::ExpireHold(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (gate_.Expire(now)) StartIfCompleteLocked();
}

absl::Status Session::CheckSettled(uint64_t token) const {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  return gate_.CheckSettled(token);
}

absl::StatusOr<std::vector<HeldTensor>> Session::HeldTensors(uint64_t token,
                                                             const StateSelection& selection) {
  StepCounters counters;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckUsable());
    OPTSTEP_RETURN_IF_ERROR(gate_.CheckSettled(token));
    counters = counters_;
  }
  return replica_->SelectTensors(selection, shared_from_this(), counters);
}

absl::StatusOr<std::shared_ptr<const StateDict>> Session::ExportHeld(
    uint64_t token, const StateSelection& selection) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> tensors, HeldTensors(token, selection));
  return ReplicaState::CopyToHost(tensors);
}

absl::Status Session::StageState(uint64_t token, std::shared_ptr<const StateDict> state,
                                 bool complete) {
  if (complete) {
    OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> expected,
                             HeldTensors(token, StateSelection{}));
    for (const HeldTensor& t : expected) {
      if (state->count(t.key) == 0) {
        return absl::DataLossError(absl::StrCat("session '", id_, "' rank ", rank(),
                                                ": the state lacks key '", t.key, "'"));
      }
    }
  } else {
    OPTSTEP_RETURN_IF_ERROR(CheckSettled(token));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<ResolvedState> resolved,
                           replica_->Resolve(std::move(state)));
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  return gate_.Stage(token, std::move(resolved));
}

absl::Status Session::ApplyStaged(uint64_t token) {
  std::shared_ptr<ResolvedState> staged;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckUsable());
    OPTSTEP_ASSIGN_OR_RETURN(staged, gate_.TakeStaged(token));
  }
  // On the coordinator, so that no snapshot reads the masters while they are replaced.
  absl::Notification done;
  absl::Status status;
  std::vector<StepCallback> aborted;
  coordinator_->Post([&] {
    status = coordinator_->OnDevice([&] { return replica_->WriteResolved(*staged); });
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      WriteCountersLocked(*staged);
      aborted = AbortLocked();
    }
    done.Notify();
  });
  done.WaitForNotification();
  const absl::Status reason = absl::AbortedError(
      absl::StrCat("session '", id_,
                   "': the state was replaced (checkpoint load or state dict import) "
                   "while this step was pending; redo it from the restored step"));
  for (StepCallback& callback : aborted) callback(reason);
  return status;
}

void Session::WriteCountersLocked(const ResolvedState& resolved) {
  if (resolved.step) counters_.step = *resolved.step;
  if (resolved.skipped_steps) counters_.skipped_steps = *resolved.skipped_steps;
  snapshots_.clear();
  last_outcome_.reset();
  ++generation_;
}

// --- One rank, between steps ---

void Session::ExportState(
    std::vector<uint32_t> model_chunks,
    std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)> done) {
  if (layout().world_size > 1) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("session '", id_, "' spans ", layout().world_size,
                     " ranks; export its state through a hold (Session::Hold / ExportHeld)")));
  }
  // On the coordinator, between steps, so that the values are those of one step.
  coordinator_->Post(
      [self = shared_from_this(), chunks = std::move(model_chunks), done = std::move(done)] {
        StateSelection selection;
        selection.model_chunks = chunks;
        StepCounters counters;
        {
          absl::MutexLock lock(&self->mu_);
          counters = self->counters_;
        }
        absl::StatusOr<std::shared_ptr<const StateDict>> dict;
        absl::Status status = self->coordinator_->OnDevice([&] {
          dict = ReplicaState::CopyToHost(self->replica_->SelectTensors(selection, self, counters));
          return dict.status();
        });
        done(status.ok() ? std::move(dict) : status);
      });
}

void Session::ImportState(std::shared_ptr<const StateDict> state,
                          std::function<void(absl::Status)> done) {
  if (layout().world_size > 1) {
    return done(absl::FailedPreconditionError(
        absl::StrCat("session '", id_, "' spans ", layout().world_size,
                     " ranks; import its state through a hold (Session::Hold / StageState)")));
  }
  coordinator_->Post([self = shared_from_this(), state = std::move(state), done = std::move(done)] {
    {
      absl::MutexLock lock(&self->mu_);
      if (self->running_ || self->contributions_.started() || self->gate_.held()) {
        return done(absl::FailedPreconditionError(
            absl::StrCat("session '", self->id_, "': step ", self->counters_.step + 1,
                         " is pending or the session is held; import a state dict between steps")));
      }
      self->running_ = true;  // no step starts while the state is replaced
    }
    absl::StatusOr<std::shared_ptr<ResolvedState>> resolved = self->replica_->Resolve(state);
    absl::Status status = resolved.status();
    if (resolved.ok()) {
      status =
          self->coordinator_->OnDevice([&] { return self->replica_->WriteResolved(**resolved); });
    }
    {
      absl::MutexLock lock(&self->mu_);
      if (status.ok()) self->WriteCountersLocked(**resolved);
      self->running_ = false;
    }
    done(status);
  });
}

}  // namespace optstep
