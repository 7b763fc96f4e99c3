// Session's initial values (InitParameters): written into the replica, and into the shadow of
// the predecessor where this rank keeps one, before the first step only.

#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "server/engine/finite_values.h"
#include "server/engine/session.h"

namespace optstep {

absl::Status Session::InitValues(int param_id, int64_t offset, DType dtype, const void* data,
                                 size_t bytes) {
  const InitPiece piece{param_id, offset, dtype,
                        absl::string_view(static_cast<const char*>(data), bytes)};
  return InitValues(absl::MakeConstSpan(&piece, 1));
}

absl::Status Session::InitValues(absl::Span<const InitPiece> pieces) {
  absl::Notification written;
  absl::Status status;
  InitValues(std::vector<InitPiece>(pieces.begin(), pieces.end()), [&](absl::Status s) {
    status = std::move(s);
    written.Notify();
  });
  written.WaitForNotification();
  return status;
}

absl::Status Session::InitAfterFirstStepError(uint64_t step) const {
  return absl::FailedPreconditionError(
      absl::StrCat("session '", id_,
                   "': initial values can only be set before the first step (at step ", step, ")"));
}

absl::Status Session::StepOneAppliedLocked() const {
  if (book_.counters().step > 0) return InitAfterFirstStepError(book_.counters().step);
  // Step 1 cut by a lost peer after this rank's own update or its shadow's (the counters still
  // at 0): values written now would stay, since the redo skips the updates applied already, and
  // step 1 would be lost. Read between steps and with no state write only: nothing writes them
  // then (the coordinator does during a resolution or an import, and in state_writes_).
  if (!book_.between_steps() || state_writes_ > 0) return absl::OkStatus();
  const bool own = replica_->owned_applied_step() > 0;
  if (!own && (shadow_ == nullptr || shadow_->step() == 0)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "session '", id_, "': initial values can only be set before the first step (rank ", rank(),
      " applied step 1 to ", own ? "its own parameters" : "its predecessor's shadow",
      " before a lost peer interrupted it; the step is taken again, not the values)"));
}

absl::Status Session::CheckInitTakenLocked() const {
  OPTSTEP_RETURN_IF_ERROR(StepOneAppliedLocked());
  // Passing: the values may be sent again once the group serves (an interrupted step waits for
  // its redo, a hold ends, a heal imports state here, a refresh writes the shadow).
  if (book_.interrupted().has_value()) {
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank(),
                                               " waits for the group to heal: a lost peer "
                                               "interrupted step ",
                                               *book_.interrupted(), "; nothing was written"));
  }
  OPTSTEP_RETURN_IF_ERROR(book_.CheckUsable());  // closed, or broken by a lost peer
  if (gate_.held()) {
    // A Save, a Load or a state dict export holds the session: values written now would be
    // half in its checkpoint, or overwritten by the state it loads.
    return absl::UnavailableError(
        absl::StrCat("session '", id_, "': a checkpoint or state dict operation holds it on rank ",
                     rank(), "; nothing was written"));
  }
  if (HealPausedLocked() || state_writes_ > 0) {
    return absl::UnavailableError(
        absl::StrCat("session '", id_, "': rank ", rank(), " writes state ",
                     HealPausedLocked() ? "it takes from its peers (the group heals)"
                                        : "imported from a peer or a checkpoint",
                     "; nothing was written"));
  }
  if (book_.running()) {
    // No step began (no trainer sent anything), so it is a state import (ImportOnCoordinator),
    // or step 1 resolves: the values may be sent again once it ended (and are then refused,
    // if it was step 1).
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank(),
                                               " writes its state; nothing was written"));
  }
  if (!book_.between_steps()) return InitAfterFirstStepError(book_.counters().step);
  return absl::OkStatus();
}

void Session::InitValues(std::vector<InitPiece> pieces, DoneCallback done,
                         std::function<bool()> abandoned) {
  std::vector<int64_t> counts;
  counts.reserve(pieces.size());
  for (const InitPiece& piece : pieces) {
    // A piece with a non-finite value is refused, and with it every piece: none is written.
    absl::StatusOr<int64_t> count = CheckInitPiece(piece);
    if (!count.ok()) return done(count.status());
    counts.push_back(*count);
  }
  coordinator_->Post([self = shared_from_this(), pieces = std::move(pieces),
                      counts = std::move(counts), done = std::move(done),
                      abandoned = std::move(abandoned)] {
    std::map<DType, std::shared_ptr<const ParamSnapshot>> stale;  // dropped after the lock
    absl::Status status;
    {
      absl::MutexLock lock(&self->mu_);
      status = self->CheckInitTakenLocked();
      if (status.ok() && abandoned && abandoned()) {
        // Its caller is gone (cancelled while the write waited its turn): it was told it failed.
        status = absl::CancelledError(
            absl::StrCat("session '", self->id_,
                         "': the initial values' call was cancelled before they "
                         "were written; nothing was written"));
      }
      if (status.ok()) {
        stale.swap(self->book_.snapshots());
        ++self->init_writes_;
      }
    }
    if (!status.ok()) return done(status);  // told without the lock, as every callback
    // Outside the lock, a piece at a time on the device worker: a session's values may be
    // gigabytes, and its steps' headers, the rank's health (which asks every session) and the
    // other sessions' device work go on meanwhile. What reads the masters runs on this
    // coordinator after this task, or is held (SessionHolds::Settle waits for the write).
    status = self->WriteInitValues(pieces, counts);
    {
      absl::MutexLock lock(&self->mu_);
      --self->init_writes_;
    }
    done(status);
  });
}

absl::Status Session::WriteInitValues(const std::vector<InitPiece>& pieces,
                                      const std::vector<int64_t>& counts) {
  return coordinator_->OnDeviceSliced(
      "initial values", static_cast<int>(pieces.size()), [&](int i) -> absl::Status {
        const InitPiece& piece = pieces[i];
        OPTSTEP_RETURN_IF_ERROR(replica_->WriteValues(piece.param_id, piece.offset, piece.dtype,
                                                      piece.data.data(), counts[i]));
        // The predecessor's initial values into its shadow too (it keeps only those): a rank
        // lost before step 1 seeds the shadow takes them back from it.
        if (shadow_ == nullptr) return absl::OkStatus();
        return shadow_->replica().WriteValues(piece.param_id, piece.offset, piece.dtype,
                                              piece.data.data(), counts[i]);
      });
}

absl::StatusOr<int64_t> Session::CheckInitPiece(const InitPiece& piece) const {
  {
    // A stream whose values would be refused now is ended at its first piece, not once it
    // staged them all: past the first step (or its part applied here) for good, and while the
    // group heals or a checkpoint holds the session until then (its trainers send them again).
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckInitTakenLocked());
  }
  OPTSTEP_ASSIGN_OR_RETURN(
      const int64_t count,
      replica_->ValueCount(piece.param_id, piece.offset, piece.dtype, piece.data.size()));
  OPTSTEP_RETURN_IF_ERROR(
      CheckFiniteValues(absl::StrCat("param '", replica_->names()[piece.param_id], "'"),
                        "initial value", piece.offset, piece.dtype, piece.data.data(), count));
  return count;
}

}  // namespace optstep
