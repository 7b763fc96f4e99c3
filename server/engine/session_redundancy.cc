// Session's part in state redundancy (shadow_state.h): the interrupted step, and the exports and
// imports through which a healed rank gets its own state, its shadow and the masters.

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/replica_state_dict.h"
#include "server/engine/session.h"

namespace optstep {

std::optional<uint64_t> Session::interrupted_step() const {
  absl::MutexLock lock(&mu_);
  return book_.interrupted();
}

Session::Health Session::health() const {
  absl::MutexLock lock(&mu_);
  return Health{book_.broken(), book_.interrupted()};
}

void Session::MarkInterrupted(uint64_t step) {
  absl::MutexLock lock(&mu_);
  LOG(WARNING) << "session " << id_ << " rank " << rank() << ": step " << step
               << " interrupted by a lost peer; waiting for the group to heal";
  book_.MarkInterrupted(step);
}

absl::Status Session::PauseForHeal(uint64_t generation, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (generation <= heals_ended_) {
    LOG(WARNING) << "session " << id_ << " rank " << rank() << ": the heal into generation "
                 << generation << " ended before it paused the session; it stays unpaused";
    return absl::OkStatus();
  }
  heal_paused_for_ = std::max(heal_paused_for_, generation);
  const auto idle = [](StepBook* book) { return !book->running(); };
  if (mu_.AwaitWithDeadline(absl::Condition(+idle, &book_), deadline)) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("session '", id_, "': rank ", rank(), " still resolves step ",
                   book_.counters().step + 1, " as the heal begins"));
}

void Session::CancelHealPause(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  heals_ended_ = std::max(heals_ended_, generation);
  if (HealPausedLocked()) return;   // by a later heal, which ends it
  book_.RestartClock(absl::Now());  // the trainers' redo gets the whole deadline
  if (!book_.interrupted()) StartResolutionLocked(ResolutionKind::kApply);
}

void Session::ResumeAfterHeal(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  heals_ended_ = std::max(heals_ended_, generation);
  if (HealPausedLocked()) return;  // by a later heal, which ends it
  // A step pending here while the group healed (its trainers cut off, and redoing their part
  // now) may have waited longer than its deadline: the deadline runs again from here, or the
  // first check would abort the redo, which a trainer takes for the end of the step.
  book_.RestartClock(absl::Now());
  if (book_.interrupted()) {
    LOG(INFO) << "session " << id_ << " rank " << rank() << ": the group healed; step "
              << *book_.interrupted() << " is taken again";
    book_.Resume();
  }
  StartResolutionLocked(ResolutionKind::kApply);  // when every trainer committed already
}

void Session::ExportOnCoordinator(
    std::function<absl::StatusOr<std::shared_ptr<const StateDict>>()> read, StateCallback done) {
  coordinator_->Post([self = shared_from_this(), read = std::move(read), done = std::move(done)] {
    absl::StatusOr<std::shared_ptr<const StateDict>> state;
    absl::Status status = self->coordinator_->OnDevice([&] {
      state = read();
      return state.status();
    });
    if (!status.ok()) return done(status);
    done(std::move(state));
  });
}

void Session::ExportOwnedState(StateCallback done) {
  ExportOnCoordinator([this] { return ExportOwned(*replica_); }, std::move(done));
}

void Session::ExportShadow(StateCallback done) {
  ExportOnCoordinator(
      [this]() -> absl::StatusOr<std::shared_ptr<const StateDict>> {
        if (shadow_ == nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              "session '", id_, "': rank ", rank(), " keeps no shadow (state redundancy is off)"));
        }
        OPTSTEP_RETURN_IF_ERROR(shadow_->CheckUsable());
        return ExportOwned(shadow_->replica());
      },
      std::move(done));
}

void Session::ExportMasters(StateCallback done) {
  ExportOnCoordinator(
      [this] {
        StateSelection selection;
        selection.owned_state = false;
        StepCounters counters;
        uint64_t ahead = replica_->owned_applied_step();
        {
          absl::MutexLock lock(&mu_);
          counters = book_.counters();
          ahead = std::max(ahead, masters_ahead_to_.value_or(0));
        }
        // This rank's own masters took the step a lost peer interrupted, or it took such a
        // peer's in a heal: the importer must not answer them as the counters' step
        // (CheckMastersAtStepLocked).
        if (ahead > counters.step) counters.masters_step = ahead;
        return CopyStateToHost(SelectState(*replica_, selection, nullptr, counters));
      },
      std::move(done));
}

void Session::ImportOnCoordinator(std::function<absl::Status()> write, std::function<void()> then,
                                  DoneCallback done) {
  coordinator_->Post([self = shared_from_this(), write = std::move(write), then = std::move(then),
                      done = std::move(done)] {
    absl::Status refused;
    {
      absl::MutexLock lock(&self->mu_);
      if (!self->book_.between_steps()) {
        refused = absl::FailedPreconditionError(
            absl::StrCat("session '", self->id_, "': step ", self->book_.counters().step + 1,
                         " is pending; a healed state is imported between steps"));
      } else {
        self->book_.set_running(true);  // no step starts while the state is replaced
      }
    }
    if (!refused.ok()) return done(refused);  // told without the lock, as every callback
    const absl::Status status = self->coordinator_->OnDevice(write);
    {
      absl::MutexLock lock(&self->mu_);
      if (status.ok() && then) then();
      self->book_.set_running(false);
    }
    done(status);
  });
}

void Session::ImportOwnedState(std::shared_ptr<const StateDict> state, DoneCallback done) {
  ImportOnCoordinator([this, state = std::move(state)] { return ImportOwned(*replica_, state); },
                      nullptr, std::move(done));
}

void Session::ImportShadow(std::shared_ptr<const StateDict> state, DoneCallback done) {
  // Written whatever the pending step, whose contributions never touch the shadow: a trainer
  // that began the next step after a Load must not keep the shadow stale (the refresh that
  // follows the Load would be refused, and the next loss not healed). Nothing is marked: the
  // resolutions run on this coordinator too, so never during the write, and a trainer's Begin
  // meanwhile must not be taken for a retry of a step that resolves (StepBook::Begin). Initial
  // values, which write the shadow too before step 1, are refused meanwhile (state_writes_).
  coordinator_->Post([self = shared_from_this(), state = std::move(state), done = std::move(done)] {
    {
      absl::MutexLock lock(&self->mu_);
      ++self->state_writes_;
    }
    const absl::Status status = self->coordinator_->OnDevice([&]() -> absl::Status {
      if (self->shadow_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("session '", self->id_, "': rank ", self->rank(),
                         " keeps no shadow (state redundancy is off)"));
      }
      OPTSTEP_RETURN_IF_ERROR(ImportOwned(self->shadow_->replica(), state));
      self->shadow_->Revalidate();
      return absl::OkStatus();
    });
    {
      absl::MutexLock lock(&self->mu_);
      --self->state_writes_;
    }
    done(status);
  });
}

void Session::CatchUp(std::shared_ptr<const StateDict> masters, DoneCallback done) {
  auto resolved = std::make_shared<std::shared_ptr<ResolvedState>>();
  ImportOnCoordinator(
      [this, masters = std::move(masters), resolved]() -> absl::Status {
        OPTSTEP_ASSIGN_OR_RETURN(*resolved, ResolveState(*replica_, masters, /*from_peer=*/true));
        OPTSTEP_RETURN_IF_ERROR(CheckCatchUp(**resolved));
        return WriteResolvedState(*replica_, **resolved);
      },
      [this, resolved]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        book_.WriteCounters(**resolved);
        masters_ahead_to_ = (*resolved)->masters_step;
      },
      std::move(done));
}

absl::Status Session::CheckCatchUp(const ResolvedState& peer) const {
  StepCounters counters;
  {
    absl::MutexLock lock(&mu_);
    counters = book_.counters();
  }
  // A rank interrupted in the step after its update, or a rank just healed in, whose own state
  // came from a shadow that took the step; a state import leaves owned_applied_step at 0.
  const uint64_t step = counters.step + 1;
  const bool skipped = peer.skipped_steps == counters.skipped_steps + 1;
  if (peer.step == step && (replica_->owned_applied_step() == step || skipped)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("session '", id_, "': rank ", rank(), " at step ", counters.step,
                   " (its own update applied up to step ", replica_->owned_applied_step(),
                   ") cannot take the masters of step ", peer.step ? absl::StrCat(*peer.step) : "?",
                   " from a peer: its optimizer state would be at another step"));
}

void Session::ImportMasters(std::shared_ptr<const StateDict> state, DoneCallback done) {
  auto resolved = std::make_shared<std::shared_ptr<ResolvedState>>();
  ImportOnCoordinator(
      [this, state = std::move(state), resolved]() -> absl::Status {
        OPTSTEP_ASSIGN_OR_RETURN(*resolved, ResolveState(*replica_, state, /*from_peer=*/true));
        return WriteResolvedState(*replica_, **resolved);
      },
      [this, resolved]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        book_.WriteCounters(**resolved);
        masters_ahead_to_ = (*resolved)->masters_step;
      },
      std::move(done));
}

}  // namespace optstep
