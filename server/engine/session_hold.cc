// Session: holds that bring every rank to the same resolution, and the operations that run while
// a rank is held there (export, staging and applying a state).
//
// Why resolutions and not steps: a rank's coordinator meets its peers in one all-reduce (and,
// for an applied step, one all-gather) per resolution, whether the step was applied, skipped or
// aborted. A rank that stops resolving while a peer is inside resolution k would leave that peer
// in its collective; so a hold only stops resolutions that no rank has begun yet.

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "glog/logging.h"
#include "base/status_macros.h"
#include "server/engine/session.h"

namespace optstep {

bool Session::MayStartResolutionLocked() const {
  return !hold_ || resolutions_started_ < hold_->limit;
}

bool Session::StartResolutionLocked(bool abort) {
  if (!MayStartResolutionLocked()) return false;  // deferred until the hold ends or rises
  running_ = true;
  ++resolutions_started_;
  coordinator_->Post([self = shared_from_this(), abort] {
    self->RunStep(abort);
    absl::MutexLock lock(&self->mu_);
    ++self->resolutions_done_;
  });
  return true;
}

absl::Status Session::CheckHolderLocked(uint64_t token) const {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  if (!hold_ || hold_->token != token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "' rank ", rank_, ": hold ", token,
        " is not active (it was released or its lease passed)"));
  }
  return absl::OkStatus();
}

absl::Status Session::CheckSettledLocked(uint64_t token) const {
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  if (!hold_->settled) {
    return absl::FailedPreconditionError(absl::StrCat("session '", id_, "' rank ", rank_,
                                                      ": hold ", token, " has not settled"));
  }
  return absl::OkStatus();
}

void Session::EndHoldLocked() {
  hold_.reset();
  // A step whose contributions all arrived during the hold starts now.
  if (!closed_ && !broken_ && !running_ && contributions_.all_committed()) {
    StartResolutionLocked(/*abort=*/false);
  }
}

absl::StatusOr<uint64_t> Session::Hold(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  const absl::Time now = absl::Now();
  if (hold_ && hold_->token != token) {
    if (hold_->expires > now) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session '", id_, "': another checkpoint or state dict operation is in progress "
          "(hold ", hold_->token, "); retry when it ends"));
    }
    LOG(WARNING) << "session " << id_ << " rank " << rank_ << ": hold " << hold_->token
                 << " expired; taken over by " << token;
    hold_.reset();
  }
  if (!hold_) {
    hold_.emplace();
    hold_->token = token;
    hold_->limit = resolutions_started_;
  }
  hold_->expires = now + lease;
  return resolutions_started_;
}

absl::StatusOr<HeldPoint> Session::Settle(uint64_t token, uint64_t target, absl::Time deadline,
                                          absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  if (resolutions_started_ > target) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session '", id_, "' rank ", rank_, ": cannot settle at resolution ", target,
        "; this rank already started ", resolutions_started_));
  }
  hold_->limit = target;
  hold_->expires = std::max(deadline, absl::Now()) + lease;
  // A resolution that another rank began must end here too: if no trainer has begun this step
  // on this rank, its step deadline starts now, so that the step is aborted everywhere in time
  // rather than leaving the other rank inside its collective.
  if (resolutions_started_ < target && !step_began_) step_began_ = absl::Now();
  if (!running_ && contributions_.all_committed()) StartResolutionLocked(/*abort=*/false);
  struct Wait {
    Session* self;
    uint64_t token;
    uint64_t target;
  } wait{this, token, target};
  auto ready = +[](Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Session* s = w->self;
    return s->closed_ || s->broken_ || !s->hold_ || s->hold_->token != w->token ||
           s->resolutions_done_ >= w->target;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(ready, &wait), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "session '", id_, "' rank ", rank_, ": resolution ", target,
        " did not finish in time (finished ", resolutions_done_,
        "); a step may be waiting for trainers on some rank"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  hold_->settled = true;
  return HeldPoint{resolutions_done_, step_, skipped_steps_};
}

absl::Status Session::Release(uint64_t token) {
  absl::MutexLock lock(&mu_);
  if (hold_ && hold_->token == token) EndHoldLocked();
  return absl::OkStatus();
}

void Session::ExpireHold(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!hold_ || hold_->expires > now) return;
  LOG(WARNING) << "session " << id_ << " rank " << rank_ << ": hold " << hold_->token
               << " expired without a release; steps continue";
  EndHoldLocked();
}

absl::StatusOr<std::vector<HeldTensor>> Session::HeldTensors(uint64_t token,
                                                             const StateSelection& selection) {
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
  }
  return SelectTensors(selection);
}

absl::StatusOr<std::shared_ptr<const StateDict>> Session::ExportHeld(
    uint64_t token, const StateSelection& selection) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> tensors, HeldTensors(token, selection));
  return CopyToHost(tensors);
}

absl::Status Session::StageState(uint64_t token, std::shared_ptr<const StateDict> state,
                                 bool complete) {
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
  }
  if (complete) {
    for (const HeldTensor& t : SelectTensors(StateSelection{})) {
      if (state->count(t.key) == 0) {
        return absl::DataLossError(absl::StrCat("session '", id_, "' rank ", rank_,
                                                ": the state lacks key '", t.key, "'"));
      }
    }
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<ResolvedState> resolved,
                           ResolveStateDict(std::move(state)));
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
  hold_->staged = std::move(resolved);
  return absl::OkStatus();
}

absl::Status Session::ApplyStaged(uint64_t token) {
  std::shared_ptr<ResolvedState> staged;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
    if (hold_->staged == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("session '", id_, "' rank ", rank_,
                                                        ": no state staged under hold ", token));
    }
    staged = std::move(hold_->staged);
  }
  // On the coordinator, so that no snapshot reads the masters while they are replaced.
  absl::Notification done;
  absl::Status status;
  std::vector<StepCallback> aborted;
  coordinator_->Post([&] {
    status = OnDevice([&] { return WriteResolved(*staged); });
    absl::MutexLock lock(&mu_);
    if (status.ok()) aborted = AbortLocked();
    done.Notify();
  });
  done.WaitForNotification();
  const absl::Status reason = absl::AbortedError(absl::StrCat(
      "session '", id_, "': the state was replaced (checkpoint load or state dict import) "
      "while this step was pending; redo it from the restored step"));
  for (StepCallback& callback : aborted) callback(reason);
  return status;
}

}  // namespace optstep
