// RankProcess (rank_process.h): joining the group, and rejoining a running group after a restart
// (a rank other than 0 asks rank 0 to heal it in; a restarted rank 0 heals itself in; heal.h);
// and the start's sweep of the checkpoint root.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "checkpoint/temporaries.h"
#include "glog/logging.h"
#include "server/rank_process.h"
#include "server/rpc/auto_restore.h"
#include "server/rpc/heal.h"
#include "server/testing_faults.h"

namespace optstep {
namespace {

// Testing only (Options::kill_during_restore): SIGKILLs this process once the first restored
// session is recreated on every rank, before its checkpoint loads; null when not `enabled`.
std::function<void(const std::string&)> KillDuringRestore(bool enabled) {
  if (!enabled) return nullptr;
  return [](const std::string& session_id) {
    KillSelf(absl::StrCat("event=killed_during_restore session=", session_id),
             "kill_during_restore=true");
  };
}

}  // namespace

bool RankProcess::heals() const {
  return options_.world_size > 1 &&
         (options_.state_redundancy < 0 ? options_.world_size >= 2
                                        : options_.state_redundancy == 1);
}

bool RankProcess::AwaitsRejoin(int rank) const {
  // Rank 0 too, once the group formed: its next process heals itself in (HealRankZero).
  return heals() && group_->lost_peers() <= 1 && (rank != 0 || group_->formed());
}

bool RankProcess::FindsRunningGroup(GrpcKeyValueStore* store) {
  // Each look gets a few heartbeat intervals: a store that serves answers well within that.
  const absl::Duration look = 5 * options_.heartbeat_interval;
  const absl::Time deadline = absl::Now() + options_.comm_timeout;
  do {
    // Rank 0's own process serves its configured store (it publishes its address there first).
    if (store->Peek(RankAddressKey(0), look).ok()) {
      return store->Get(kGroupFormedKey, absl::ZeroDuration()).ok();
    }
    const std::string told = group_->heard_rendezvous();
    if (!told.empty()) {
      store->Retarget(told);
      if (store->Peek(kGroupFormedKey, look).ok()) {
        LOG(WARNING) << "event=rendezvous_found rank=" << options_.rank << " address=" << told
                     << " rank 0 is stood in for: this rank rejoins at its stand-in's store";
        return true;
      }
      store->Retarget(options_.rendezvous);
    }
  } while (absl::Now() < deadline &&
           !shutdown_requested_.WaitForNotificationWithTimeout(options_.heartbeat_interval));
  return false;
}

bool RankProcess::RejoinGroup(const std::string& address) {
  const absl::Time started = absl::Now();
  absl::StatusOr<uint64_t> generation = RequestRejoin(group_.get(), address);
  if (!generation.ok()) {
    LOG(ERROR) << "event=rejoin_failed rank=" << options_.rank << " error=\""
               << LogValue(generation.status().message()) << "\"";
    ExitForRestart("rank 0 could not heal this rank into the running group");
    return false;
  }
  LOG(WARNING) << "event=rejoined rank=" << options_.rank << " generation=" << *generation
               << " took_s=" << absl::ToDoubleSeconds(absl::Now() - started);
  return true;
}

bool RankProcess::RejoinAsRankZero(bool* healed) {
  const absl::Time started = absl::Now();
  absl::StatusOr<std::optional<uint64_t>> generation = HealRankZero(engine_.get(), group_.get());
  if (!generation.ok()) {
    LOG(ERROR) << "event=rejoin_failed rank=0 error=\"" << LogValue(generation.status().message())
               << "\"";
    ExitForRestart("rank 0 could not heal itself into the running group",
                   /*even_without_flag=*/true);
    return false;
  }
  *healed = generation->has_value();
  if (is_stand_in() && !*healed) {
    // A stand-in for rank 0 heals itself into the survivors' group or nothing: it never starts a
    // group of its own.
    LOG(ERROR) << "event=stand_in_failed rank=0 why=\"no rank waits for rank 0\"";
    return false;
  }
  LOG_IF(WARNING, *healed) << "event=rejoined rank=0 generation=" << generation->value_or(0)
                           << " took_s=" << absl::ToDoubleSeconds(absl::Now() - started);
  return true;
}

void RankProcess::PublishForRankZero(const std::string& address) {
  bool published = false;
  while (!shutdown_requested_.WaitForNotificationWithTimeout(options_.heartbeat_interval)) {
    if (!group_->AwaitsRankZero()) {
      published = false;
      continue;
    }
    // Rank 0's next process serves a new, empty store: its Join waits for this rank's address
    // there, then it heals itself into the group (HealRankZero). Set again at every interval:
    // that process may be lost too before it heals. A stand-in for rank 0 serves its own, at
    // the address rank 1 tells of (its heartbeat answers; rank 1 knows it itself).
    const std::string stand_in = group_->rank_zero_stand_in();
    store()->Retarget(stand_in.empty() ? options_.rendezvous : stand_in);
    absl::Status set =
        store()->SetWithin(RankAddressKey(options_.rank), address, options_.heartbeat_interval);
    LOG_IF(WARNING, set.ok() && !published)
        << "event=awaiting_rank_zero rank=" << options_.rank
        << " this rank's address is published to rank 0's new process";
    published = published || set.ok();
  }
}

void RankProcess::JoinGroup(const std::string& address, std::shared_ptr<GrpcKeyValueStore> store) {
  // A restarted rank finds its group formed (read before this rank publishes its address, which
  // the group's first formation waits for).
  const bool rejoin = heals() && options_.rank != 0 && FindsRunningGroup(store.get());
  absl::Status joined = group_->Join(address, store);
  if (!joined.ok()) {
    LOG(ERROR) << "rank " << options_.rank << " could not join its group: " << joined;
    // A rank that never joined serves nothing: it ends (unless it is shutting down anyway).
    if (options_.world_size > 1 && !shutdown_requested_.HasBeenNotified()) {
      ExitForRestart("the group did not form", /*even_without_flag=*/true);
    }
    return;
  }
  if (rejoin) {
    if (!RejoinGroup(address)) return;
    group_->MarkFormed();
  }
  bool healed = false;
  if (options_.rank == 0 && heals() && !RejoinAsRankZero(&healed)) return;
  joined_.Notify();
  group_->StartHeartbeats();
  if (options_.rank == 0) {
    // Before SERVING: a trainer that sees SERVING finds its session. Sessions healed from the
    // other ranks are not restored (the automatic checkpointer saves each of them at once, then
    // on its schedule).
    AutoRestoreOptions restore_options;
    restore_options.checkpoint_root = options_.checkpoint_root;
    restore_options.temp_max_age = options_.checkpoint_temp_max_age;
    restore_options.before_load = KillDuringRestore(options_.kill_during_restore);
    absl::StatusOr<std::vector<RestoredSession>> restore =
        healed ? std::vector<RestoredSession>()
               : RestoreAutoCheckpoints(restore_options, group_.get());
    if (!restore.ok()) {
      // A rank lost, or a checkpoint not read for a passing reason: the group restarts and
      // restores every session again, rather than serve without some (a rank healed in later
      // would never get them) or step one from an older checkpoint.
      ExitForRestart(std::string(restore.status().message()), /*even_without_flag=*/true);
      return;
    }
    for (const RestoredSession& restored : *restore) {
      metrics_->CountSessionRestored();
      if (auto_checkpointer_ != nullptr) {
        auto_checkpointer_->Restored(restored.session_id, restored.step);
      }
    }
    if (auto_checkpointer_ != nullptr) auto_checkpointer_->Start();
    group_->MarkFormed();  // creations are taken from now on
    if (options_.world_size > 1) {
      absl::Status formed = store->Set(kGroupFormedKey, "1");
      LOG_IF(WARNING, !formed.ok()) << "cannot mark the group formed: " << formed;
    }
  }
  // Not SERVING before every peer told it knows the group formed (PingRequest.knows_group_formed,
  // the heartbeat after the answer that told it): a rank
  // 0 lost before that restarts the group rather than heal itself in, and the steps trainers took
  // meanwhile went back to the automatic checkpoints. Before, trainers stepped at once.
  if (options_.rank == 0 && heals() && !healed &&
      !group_->AwaitFormedSeen(5 * options_.heartbeat_interval)) {
    LOG(WARNING) << "event=group_formed_unseen some ranks did not tell that they know the group "
                    "formed within five heartbeat intervals; serving all the same";
  }
  LOG(INFO) << "rank " << options_.rank << " of " << options_.world_size << " ready at " << address;
  server_->SetReady(true);
  if (options_.world_size > 1 && !is_stand_in() &&
      (options_.exit_on_peer_loss || (heals() && options_.stand_ins))) {
    WatchSessionGroups();
  }
}

void RankProcess::SweepCheckpointRoot() {
  if (options_.checkpoint_root.empty() ||
      options_.checkpoint_temp_max_age <= absl::ZeroDuration()) {
    return;
  }
  absl::StatusOr<std::vector<std::string>> swept =
      SweepStaleCheckpointTemporaries(options_.checkpoint_root, options_.checkpoint_temp_max_age);
  if (!swept.ok()) {
    LOG(WARNING) << "--checkpoint_root: " << swept.status();
  } else if (!swept->empty()) {
    LOG(INFO) << "removed the temporaries of " << swept->size()
              << " failed or interrupted checkpoint save(s) from " << options_.checkpoint_root;
  }
}

}  // namespace optstep
