// RankProcess (rank_process.h): the watch of a rank's groups (a session's group lost, a peer
// awaited to rejoin or to be stood in for, a heal's end missed) and the exit for a restart that
// ends it, for the rank's supervisor (docs/deploy.md, "Failure handling").

#include <unistd.h>

#include <atomic>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "base/run_detached.h"
#include "glog/logging.h"
#include "server/rank_process.h"

namespace optstep {

void RankProcess::WatchSessionGroups() {
  // Since when a peer has been lost or a session interrupted (and awaited to heal).
  std::optional<absl::Time> unwell_since;
  bool members_were_well = true;
  while (!shutdown_requested_.WaitForNotificationWithTimeout(options_.heartbeat_interval)) {
    EndStandInOnceReplaced();
    // Without a supervisor to restart it (--noexit_on_peer_loss) the rank waits, and watches on.
    std::optional<uint64_t> missed = group_->MissedHealEnd();
    if (missed.has_value() && options_.exit_on_peer_loss) {
      return ExitForRestart(absl::StrCat("rank 0 ended the heal into generation ", *missed,
                                         " without this rank, which heals in again restarted"));
    }
    // A session whose collectives failed has lost its group even while the heartbeats still pass;
    // one only interrupted by a lost peer (state redundancy) is healed with the rank, its step
    // redone.
    std::string interrupted;
    for (const std::shared_ptr<Session>& session : engine_->ListSessions()) {
      const Session::Health health = session->health();
      if (health.healthy()) continue;
      if (!heals() || !health.interrupted.has_value()) {
        return ExitForRestart(absl::StrCat("session ", session->id(), " lost its group"));
      }
      if (interrupted.empty()) {
        interrupted = absl::StrCat("session ", session->id(), "'s step ", *health.interrupted,
                                   " was interrupted");
      }
    }
    const absl::Status members = group_->MembersStatus();
    if (members.ok() && interrupted.empty()) {
      unwell_since.reset();
      if (stand_in_ == nullptr) stand_in_started_ = false;
      members_were_well = true;
      continue;
    }
    // While a rank heals in, the heal's own bounds (--comm_timeout_ms) apply; once it healed in
    // (its own process or a stand-in), the trainers get a rejoin timeout of their own to redo
    // the step it interrupted.
    const bool healing = members.ok() && !group_->PeersStatus().ok();
    if (!unwell_since.has_value() || healing || (members.ok() && !members_were_well)) {
      unwell_since = absl::Now();
    }
    members_were_well = members.ok() && !healing;
    if (group_->lost_peers() > 1) return ExitForRestart("two ranks lost");
    const absl::Duration waited = absl::Now() - *unwell_since;
    const int lost = LostPeer();
    if (waited > options_.rejoin_timeout && lost >= 0 && StoodInWhenLost(lost) &&
        waited <= options_.rejoin_timeout + StandInWait()) {
      // Its own process did not return: its buddy stands in for it, the others wait for that.
      if (lost == (options_.rank + options_.world_size - 1) % options_.world_size &&
          !stand_in_started_ &&
          absl::Now() - stand_in_ended_at_ >= kStandInRestartPause * options_.heartbeat_interval) {
        StartStandIn(lost);
      }
      continue;
    }
    if (waited > options_.rejoin_timeout) {
      return ExitForRestart(absl::StrCat(members.ok() ? interrupted : members.message(),
                                         "; the group did not heal within ",
                                         absl::FormatDuration(options_.rejoin_timeout)));
    }
  }
}

void RankProcess::ExitForRestart(const std::string& why, bool even_without_flag) {
  if (is_stand_in()) {
    // Its buddy's process ends the group's wait (WatchSessionGroups), not the stand-in; once it
    // serves in its rank's place, it exits as this rank would have (EndStandInOnceReplaced).
    // Before, nothing did: a stand-in for rank 0 kept healing a rank that died in every heal,
    // the group paused at each, for as long as that rank's supervisor restarted it.
    LOG(ERROR) << "event=stand_in_failed rank=" << options_.rank << " why=\"" << LogValue(why)
               << "\"";
    if (joined_.HasBeenNotified()) restart_requested_ = true;
    return;
  }
  static std::atomic<bool> exiting{false};
  if (!(options_.exit_on_peer_loss || even_without_flag) || exiting.exchange(true)) return;
  RunDetached([why, grace = options_.peer_loss_exit_grace] {
    absl::SleepFor(grace);
    LOG(ERROR) << "event=exit_on_peer_loss code=" << kPeerLossExitCode << " why=\"" << LogValue(why)
               << "\" this rank exits for its supervisor to restart the group";
    google::FlushLogFiles(google::GLOG_INFO);
    std::cout.flush();
    _exit(kPeerLossExitCode);
  });
}

}  // namespace optstep
