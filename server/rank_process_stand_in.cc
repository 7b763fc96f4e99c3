// RankProcess (rank_process.h): standing in for a lost rank that does not return. Its buddy (the
// next rank, which holds the shadow of its optimizer state) runs a second RankProcess with the
// lost rank's ordinal in its own process, which heals itself into the group as a restarted rank
// does (heal.h). The partition, the communicators' size and every step stay as they were, so the
// results stay bit-identical. When the rank's own process rejoins, it takes the stand-in's place
// in a heal of its own, and the buddy stops the stand-in without telling the peers.
// docs/deploy.md, "A rank that does not return".

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "glog/logging.h"
#include "server/rank_process.h"
#include "server/rpc/heal.h"

namespace optstep {

bool RankProcess::StoodInWhenLost(int rank) const {
  // Rank 0 only with two survivors or more: a survivor alone could not tell a lost rank 0 from
  // being cut off itself, and rank 0 would be stood in for while it still serves.
  return heals() && options_.stand_ins && (rank > 0 || options_.world_size >= 3);
}

absl::Duration RankProcess::StandInWait() const {
  return std::max(options_.rejoin_timeout, kMinStandInWait);
}

int RankProcess::LostPeer() const {
  if (group_->lost_peers() != 1) return -1;
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank && group_->peer_failed(r)) return r;
  }
  return -1;
}

bool RankProcess::RankZeroProcessBack() {
  if (rank_zero_probe_ == nullptr) {
    rank_zero_probe_ = std::make_unique<GrpcKeyValueStore>(options_.rendezvous,
                                                           group_->options().peer_credentials);
  }
  // A new process of rank 0 published its address in its own store and has formed no group
  // yet (an old one cut off and reachable again has).
  return rank_zero_probe_->Peek(RankAddressKey(0), options_.heartbeat_interval).ok() &&
         !rank_zero_probe_->Peek(kGroupFormedKey, options_.heartbeat_interval).ok();
}

void RankProcess::StartStandIn(int rank) {
  // Rank 0's own process is back, and heals itself in: no second rank 0.
  if (rank == 0 && RankZeroProcessBack()) return;
  stand_in_started_ = true;
  Options options = options_;
  options.rank = rank;
  options.port = options_.stand_in_port;
  // Rank 0's store, which a buddy of rank 0 serves itself. While rank 0 is stood in for, its
  // configured store does not answer: the stand-in finds the group at rank 0's stand-in's, as a
  // restarted rank does from the heartbeats, and still looks for rank 0's own process at the
  // configured one once that stand-in stops.
  if (options_.rank == 0) options.rendezvous = absl::StrCat(options_.advertise_host, ":", port_);
  options.heard_rendezvous = group_->rank_zero_stand_in();
  options.metrics_port = 0;
  options.metrics_port_file.clear();
  options.checkpoint_on_shutdown.clear();
  // A stand-in for rank 0 writes the group's automatic checkpoints, as rank 0 did (the root is a
  // shared file system): the fallback of a second loss then loses no more than it would have.
  // Its host sweeps the root's stale temporaries, not the stand-in.
  if (rank != 0) {
    options.checkpoint_every_steps = 0;
    options.checkpoint_every = absl::ZeroDuration();
  }
  options.checkpoint_temp_max_age = absl::ZeroDuration();
  options.exit_on_peer_loss = false;
  options.stand_ins = false;
  options.kill_before_allgather = 0;
  options.kill_after_allgather = 0;
  options.fail_allgather_after = 0;
  options.kill_during_restore = false;
  options.kill_during_close = false;
  options.kill_during_heal.clear();
  absl::StatusOr<std::unique_ptr<RankProcess>> started =
      StartProcess(std::move(options), &engine_->memory_budget());
  if (!started.ok()) {
    LOG(ERROR) << "event=stand_in_failed rank=" << rank << " error=\""
               << LogValue(started.status().message()) << "\"";
    return;
  }
  stand_in_ = *std::move(started);
  stand_in_address_ = absl::StrCat(options_.advertise_host, ":", stand_in_->port());
  metrics_->StandInsChanged(+1);
  // The other ranks learn the store of a stand-in for rank 0 from this rank's heartbeat
  // answers; this rank watches for rank 0's own process at the configured store.
  if (rank == 0) group_->SetRankZeroStandIn(stand_in_address_);
  LOG(WARNING) << "event=stand_in_started rank=" << rank << " address=" << stand_in_address_
               << " rank " << rank << " did not return within "
               << absl::FormatDuration(options_.rejoin_timeout)
               << "; this rank, its buddy, stands in for it until it does";
}

void RankProcess::EndStandInOnceReplaced() {
  if (stand_in_ == nullptr) return;
  const int rank = stand_in_->options_.rank;
  // Without a supervisor to restart it (--noexit_on_peer_loss) the host does not exit: the
  // stand-in is then handed over as ever.
  if (stand_in_->restart_requested_ && options_.exit_on_peer_loss) {
    return ExitForRestart(
        absl::StrCat("its stand-in for rank ", rank, " asked for a restart of the group"));
  }
  // A stand-in whose join ended without healing it in (its heal failed, or no rank waits for a
  // rank 0) serves nothing: it stops, and this rank stands in again while the rank is lost.
  if (stand_in_->join_ended_.HasBeenNotified() && !stand_in_->joined_.HasBeenNotified() &&
      !group_->healing()) {
    LOG(WARNING) << "event=stand_in_ended rank=" << rank
                 << " the stand-in did not heal in; this rank stands in for rank " << rank
                 << " again if it does not return";
    if (rank == 0) group_->SetRankZeroStandIn("");
    EndStandIn();
    return;
  }
  if (rank == 0) {
    // Rank 0's own process heals itself in from the survivors, this rank among them: the
    // stand-in gives way as soon as that process serves its store (it published its address
    // there), and the peers lose rank 0 again and publish theirs. Not in the middle of a heal,
    // which would leave the survivors paused.
    if (!group_->PeersStatus().ok() || !stand_in_->group_->PeersStatus().ok() ||
        !RankZeroProcessBack()) {
      return;
    }
    LOG(WARNING) << "event=stand_in_ended rank=0 address=" << options_.rendezvous
                 << " rank 0's own process is back; its stand-in stops for it to heal itself in";
    group_->SetRankZeroStandIn("");
    EndStandIn();
    return;
  }
  // A stand-in that missed the end of a heal for good stays paused (it runs no watch of its own,
  // as a rank does: WatchSessionGroups): it stops, the peers lose the rank, and this rank stands
  // in for it again after the rejoin timeout.
  if (std::optional<uint64_t> missed = stand_in_->group_->MissedHealEnd()) {
    LOG(WARNING) << "event=stand_in_ended rank=" << rank
                 << " rank 0 ended the heal into generation " << *missed
                 << " without the stand-in; it stops, and this rank stands in for rank " << rank
                 << " again if it does not return";
    EndStandIn();
    return;
  }
  const std::vector<std::string> addresses = group_->addresses();
  // Before the stand-in is healed in, the group is not whole, and knows the rank at its lost
  // process's address; after, at the stand-in's.
  if (rank >= static_cast<int>(addresses.size()) || addresses[rank] == stand_in_address_) return;
  // Another process took the rank's place. Only once its heal has ended (until its PauseForHeal
  // returned, a peer may still run a step that the stand-in takes part in): healed in, or lost
  // in its heal, which leaves the rank lost again and the stand-in out of the group. The latter
  // only once the stand-in had healed in: before, the address is still the lost process's, and
  // the stand-in's heal may simply not have begun (rank 0 heals one rank at a time).
  if (group_->PeersStatus().ok()) {
    LOG(WARNING) << "event=stand_in_ended rank=" << rank << " address=" << addresses[rank]
                 << " rank " << rank << "'s own process is back in the group; its stand-in stops";
    EndStandIn();
  } else if (stand_in_->joined_.HasBeenNotified() && !group_->healing() &&
             group_->peer_failed(rank)) {
    LOG(WARNING) << "event=stand_in_ended rank=" << rank << " address=" << addresses[rank]
                 << " the process that took rank " << rank
                 << "'s place was lost in its heal; its stand-in stops, and this rank stands in "
                    "for it again if it does not return";
    EndStandIn();
  }
}

void RankProcess::EndStandIn() {
  // The peers watch the rank's own process now (rank 0: they wait for it): they must not count
  // the rank as gone.
  stand_in_->announce_leave_ = false;
  stand_in_.reset();  // shuts it down and waits
  // The rank may be lost again (its own process, or this stand-in's heal): it is stood in for
  // again after the rejoin timeout.
  stand_in_started_ = false;
  stand_in_ended_at_ = absl::Now();
  stand_in_address_.clear();
  metrics_->StandInsChanged(-1);
}

}  // namespace optstep
