#include "server/engine/resolution_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"

namespace optstep {

ResolutionGate::ResolutionGate(std::string session_id, int rank)
    : session_id_(std::move(session_id)), rank_(rank) {}

bool ResolutionGate::MayStartLocked() const { return !hold_ || started_ < hold_->limit; }

bool ResolutionGate::TryStart() {
  absl::MutexLock lock(&mu_);
  if (!MayStartLocked()) return false;  // deferred until the hold ends or rises
  ++started_;
  return true;
}

bool ResolutionGate::FreeForLocked(uint64_t token) const {
  return stopped_ || !hold_ || hold_->token == token;
}

bool ResolutionGate::may_start() const {
  absl::MutexLock lock(&mu_);
  return MayStartLocked();
}

uint64_t ResolutionGate::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

absl::Status ResolutionGate::Adopt(uint64_t resolutions) {
  absl::MutexLock lock(&mu_);
  if (started_ != 0 || hold_) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id_, " rank ", rank_, ": cannot adopt ", resolutions,
                     " resolutions: ", started_, " started here", hold_ ? " and it is held" : ""));
  }
  started_ = done_ = resolutions;
  return absl::OkStatus();
}

void ResolutionGate::Rebase(uint64_t resolutions) {
  absl::MutexLock lock(&mu_);
  const uint64_t running = started_ - done_;
  if (hold_) hold_->limit = hold_->limit + resolutions - started_;  // modulo 2^64, as a shift
  started_ = resolutions;
  done_ = resolutions - running;
}

void ResolutionGate::Finish() {
  absl::MutexLock lock(&mu_);
  ++done_;
}

void ResolutionGate::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

bool ResolutionGate::held() const {
  absl::MutexLock lock(&mu_);
  return hold_.has_value();
}

absl::Status ResolutionGate::CheckHolderLocked(uint64_t token) const {
  if (!hold_ || hold_->token != token) {
    // ABORTED: the operation was cut short (a rank too slow for the lease, a holder that gave
    // up), not refused for its arguments; it can be tried again.
    return absl::AbortedError(absl::StrCat("session '", session_id_, "' rank ", rank_, ": hold ",
                                           token,
                                           " is not active (it was released or its lease passed)"));
  }
  return absl::OkStatus();
}

absl::Status ResolutionGate::CheckSettledLocked(uint64_t token) const {
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  if (!hold_->settled) {
    return absl::FailedPreconditionError(absl::StrCat("session '", session_id_, "' rank ", rank_,
                                                      ": hold ", token, " has not settled"));
  }
  return absl::OkStatus();
}

absl::Status ResolutionGate::CheckHolder(uint64_t token) const {
  absl::MutexLock lock(&mu_);
  return CheckHolderLocked(token);
}

absl::Status ResolutionGate::CheckSettled(uint64_t token) const {
  absl::MutexLock lock(&mu_);
  return CheckSettledLocked(token);
}

absl::StatusOr<uint64_t> ResolutionGate::Hold(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (hold_ && hold_->token != token) {
    if (hold_->expires > now) {
      return absl::AbortedError(absl::StrCat("session '", session_id_,
                                             "': another checkpoint or state dict operation is "
                                             "in progress (hold ",
                                             hold_->token, "); retry when it ends"));
    }
    LOG(WARNING) << "session " << session_id_ << " rank " << rank_ << ": hold " << hold_->token
                 << " expired; taken over by " << token;
    hold_.reset();
  }
  if (!hold_) hold_ = HoldState{token, /*limit=*/started_, now, /*settled=*/false, nullptr};
  hold_->expires = std::max(hold_->expires, now + lease);
  return started_;
}

absl::Status ResolutionGate::Renew(uint64_t token, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  if (!hold_ || hold_->token != token) {
    return absl::AbortedError(absl::StrCat("session '", session_id_, "' rank ", rank_, ": hold ",
                                           token,
                                           " is gone (its lease passed, and steps may "
                                           "have run since); the operation is abandoned: retry"));
  }
  hold_->expires = std::max(hold_->expires, absl::Now() + lease);
  return absl::OkStatus();
}

absl::Status ResolutionGate::Raise(uint64_t token, uint64_t target, absl::Time deadline,
                                   absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  if (started_ > target) {
    return absl::InvalidArgumentError(absl::StrCat("session '", session_id_, "' rank ", rank_,
                                                   ": cannot settle at resolution ", target,
                                                   "; this rank already started ", started_));
  }
  hold_->limit = target;
  hold_->expires = std::max(deadline, absl::Now()) + lease;
  return absl::OkStatus();
}

absl::Status ResolutionGate::AwaitSettled(uint64_t token, uint64_t target, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  struct Wait {
    ResolutionGate* self;
    uint64_t token;
    uint64_t target;
  } wait{this, token, target};
  auto ready = +[](Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->self->mu_) {
    return w->self->stopped_ || !w->self->hold_ || w->self->hold_->token != w->token ||
           w->self->done_ >= w->target;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(ready, &wait), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("session '", session_id_, "' rank ", rank_, ": resolution ", target,
                     " did not finish in time (finished ", done_,
                     "); a step may be waiting for trainers on some rank"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ResolutionGate::Settle(uint64_t token) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckHolderLocked(token));
  hold_->settled = true;
  return done_;
}

void ResolutionGate::AwaitFree(uint64_t token, absl::Time until) {
  absl::MutexLock lock(&mu_);
  struct Wait {
    ResolutionGate* self;
    uint64_t token;
  } wait{this, token};
  auto free = +[](Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->self->mu_) {
    return w->self->FreeForLocked(w->token);
  };
  // The condition does not see the clock: wake at the lease's end to take an expired hold over.
  while (!FreeForLocked(token) && absl::Now() < std::min(hold_->expires, until)) {
    mu_.AwaitWithDeadline(absl::Condition(free, &wait), std::min(hold_->expires, until));
  }
}

bool ResolutionGate::Release(uint64_t token) {
  absl::MutexLock lock(&mu_);
  if (!hold_ || hold_->token != token) return false;
  hold_.reset();
  return true;
}

bool ResolutionGate::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!hold_ || hold_->expires > now) return false;
  LOG(WARNING) << "session " << session_id_ << " rank " << rank_ << ": hold " << hold_->token
               << " expired without a release; steps continue";
  hold_.reset();
  return true;
}

absl::Status ResolutionGate::Stage(uint64_t token, std::shared_ptr<ResolvedState> staged) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
  hold_->staged = std::move(staged);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ResolvedState>> ResolutionGate::TakeStaged(uint64_t token) {
  absl::MutexLock lock(&mu_);
  OPTSTEP_RETURN_IF_ERROR(CheckSettledLocked(token));
  if (hold_->staged == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("session '", session_id_, "' rank ", rank_,
                                                      ": no state staged under hold ", token));
  }
  return std::move(hold_->staged);
}

}  // namespace optstep
