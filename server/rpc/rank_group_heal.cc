// RankGroup's part of a heal (rank_group.h, "Healing"): the phases of PeerService.Regroup on
// this rank, and whether it missed the end of one.

#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/rpc/rank_group.h"

namespace optstep {

absl::Status RankGroup::BeginRegroup(const v1::RegroupRequest& request) {
  const int rank = static_cast<int>(request.rank());
  {
    // Two heals of one generation: two processes of rank 0 (its stand-in and its own) each heal
    // themselves in from the same survivors; the later is refused, and fails.
    // The check and the claim in one lock scope: two such heals at once cannot both pass.
    absl::MutexLock lock(&mu_);
    if (request.generation() <= generation_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", options_.rank, " is at generation ", generation_, "; a heal into generation ",
          request.generation(), " of rank ", rank, " at ", request.address(), " comes too late"));
    }
    generation_ = request.generation();
  }
  {
    absl::MutexLock lock(&mu_);
    healing_ =
        absl::UnavailableError(absl::StrCat("rank ", rank, " is rejoining the group (generation ",
                                            generation_, "); retry when rank 0 reports SERVING"));
    healing_address_ = request.address();
    heal_end_watch_.Began(generation_);
    // A new stub (a new channel) for the new process, also at the same address.
    addresses_[rank] = request.address();
    // The stand-ins once this rank is healed in (an earlier release lists none: the rejoining
    // rank's alone).
    if (!request.stood_in_ranks().empty()) stood_in_.assign(stood_in_.size(), false);
    for (uint32_t r : request.stood_in_ranks()) {
      if (r < stood_in_.size()) stood_in_[r] = true;
    }
    stood_in_[rank] = request.stand_in();
    if (peers_[rank] != nullptr) retired_peers_.push_back(std::move(peers_[rank]));
    options_.communicators->SetGeneration(generation_);
    LOG(WARNING) << "event=regroup_begin rank=" << rank << " generation=" << generation_
                 << " address=" << request.address();
  }
  // Watched as alive from now on, as the process `request.incarnation` (the heal's held
  // operations need it; steps wait for kEnd). After the new stub: a heartbeat sent from now on
  // reaches the rejoining process, never a stand-in it replaces, whose answer would lose it.
  liveness_.Rejoined(rank, absl::Now(), request.incarnation());
  // The communicators rebuild in the coordinating rank 0's store (a stand-in's own).
  if (options_.retarget_store) options_.retarget_store(request.rendezvous());
  return absl::OkStatus();
}

absl::Status RankGroup::PauseForRegroup(const v1::RegroupRequest& request) {
  const int rank = static_cast<int>(request.rank());
  // No resolution starts until the heal ends, and one that runs (a step the lost rank cut, not
  // yet failed here) ends on the communicator it began on, before the rebuild.
  const absl::Time deadline = absl::Now() + options_.timeout;
  for (const std::shared_ptr<Session>& session : Sessions()) {
    OPTSTEP_RETURN_IF_ERROR(session->PauseForHeal(request.generation(), deadline));
    // Rank 0 held its sessions for its operations (a save): the process that held them is gone,
    // and its successor holds nothing.
    if (rank == 0) session->holds().ExpireHold(absl::InfiniteFuture());
  }
  // A heal that ended meanwhile (rank 0 gave up on this answer) closes nothing: a later heal may
  // have rebuilt the connections.
  OPTSTEP_RETURN_IF_ERROR(CheckHealing(request.generation()));
  // Nothing runs on the old connections here any more: closing them ends a collective the loss
  // cut on a peer that still waits for this rank in it, rather than at its timeout.
  options_.communicators->CloseAll(
      request.generation(),
      absl::UnavailableError(absl::StrCat("the session's communicator is closed while rank ", rank,
                                          " heals into generation ", request.generation())));
  return absl::OkStatus();
}

absl::Status RankGroup::Regroup(const v1::RegroupRequest& request) {
  const int rank = static_cast<int>(request.rank());
  if (rank < 0 || rank >= options_.world_size || options_.communicators == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.rank, " cannot take rank ", rank, " back into its group of ",
        options_.world_size, options_.communicators == nullptr ? " (it does not heal)" : ""));
  }
  switch (request.phase()) {
    case v1::RegroupRequest::PHASE_BEGIN:
      OPTSTEP_RETURN_IF_ERROR(BeginRegroup(request));
      return PauseForRegroup(request);
    case v1::RegroupRequest::PHASE_REBUILD: {
      std::set<std::string> open;
      for (const std::shared_ptr<Session>& session : Sessions()) open.insert(session->id());
      return options_.communicators->RebuildAll(request.generation(), open);
    }
    case v1::RegroupRequest::PHASE_END: {
      // A failed heal leaves the rank to the heartbeats: it is lost again once it stops answering.
      {
        absl::MutexLock lock(&mu_);
        // The end of another heal: one refused here (two processes of rank 0 heal themselves in
        // at once, and the later one ends its heal, failed, on every rank), or one that reaches
        // the next process of a rank lost in it. Ending the running heal would let steps and the
        // heal run at once, and a failed rank-0 heal would restart the group.
        if (healing_.ok() || request.generation() != generation_ ||
            request.address() != healing_address_) {
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", options_.rank, " ignores the end of a heal of rank ", rank, " at ",
              request.address(), " into generation ", request.generation(), ": ",
              healing_.ok() ? "it runs no heal"
                            : absl::StrCat("it runs the heal of ", healing_address_,
                                           " into generation ", generation_)));
        }
        healing_ = absl::OkStatus();
        heal_end_watch_.Ended();
        healing_address_.clear();
        LOG(WARNING) << "event=regroup_end rank=" << rank << " generation=" << generation_
                     << (request.failed() ? " failed=true" : " failed=false");
      }
      // Healed: every rank's caller resumes the sessions (ResumeSessions), each at the group's
      // count of resolutions.
      for (const std::shared_ptr<Session>& session : Sessions()) {
        auto common = request.resolutions().find(session->id());
        if (!request.failed() && common != request.resolutions().end()) {
          session->RebaseResolutions(common->second);
        }
      }
      if (!request.failed()) CountHealed(rank);
      if (request.failed()) {
        // The rank's process may live on, but holds no (or part of its) state: nothing may run
        // with it. It is lost until a heal of its next process (or this one again) ends well;
        // the connections the heal rebuilt with it close.
        if (rank != options_.rank) {
          liveness_.Lose(rank, absl::UnavailableError(absl::StrCat(
                                   "rank ", rank, " lost (its heal into generation ",
                                   request.generation(), " failed); it heals in when restarted")));
          options_.communicators->CloseAll(
              request.generation(),
              absl::UnavailableError(
                  absl::StrCat("the session's communicator is closed: the heal of rank ", rank,
                               " into generation ", request.generation(), " failed")));
        }
        for (const std::shared_ptr<Session>& session : Sessions())
          session->CancelHealPause(request.generation());
        // Rank 0's own heal failed (its process exits for a restart). For a passing reason (a
        // call lost on the way) its next process heals in, as another rank's would: the
        // survivors wait for it, a few times in a row. Otherwise (a state refused, a transfer
        // that failed) its next process would most likely fail the same way, so the group
        // restarts as a whole at once rather than after the rejoin timeout. Before, a passing
        // failure restarted the group too.
        const bool waits = request.retry() && CountHealLost(0) <= kMaxHealsLostInARow;
        if (rank == 0 && options_.rank != 0 && !waits && options_.on_heal_failed) {
          options_.on_heal_failed(absl::AbortedError("rank 0 could not heal itself in"));
        }
        LOG_IF(WARNING, rank == 0 && options_.rank != 0 && waits)
            << "event=rank_lost_while_healing rank=0 generation=" << request.generation()
            << " the group waits for the rank's next process";
      }
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Regroup: unknown phase ", static_cast<int>(request.phase())));
  }
}

bool RankGroup::healing() const {
  absl::MutexLock lock(&mu_);
  return !healing_.ok();
}

void RankGroup::HearOfRankZeroHeal(uint64_t generation, bool healing) {
  absl::MutexLock lock(&mu_);
  heal_end_watch_.HeardRankZero(generation, healing, absl::Now());
}

std::optional<uint64_t> RankGroup::MissedHealEnd() const {
  absl::MutexLock lock(&mu_);
  return heal_end_watch_.Missed(absl::Now());
}

absl::Status RankGroup::CheckHealing(uint64_t generation) const {
  absl::MutexLock lock(&mu_);
  if (healing_.ok() || generation != generation_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", options_.rank, " is ", healing_.ok() ? "not healing" : "healing",
                     " generation ", generation_, ", not in a heal into generation ", generation));
  }
  return absl::OkStatus();
}

}  // namespace optstep
