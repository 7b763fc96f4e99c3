#include "server/rpc/held_operations.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "checkpoint/temporaries.h"
#include "glog/logging.h"
#include "server/engine/finite_values.h"
#include "server/engine/session_checkpoint.h"
#include "server/rpc/convert.h"
#include "server/rpc/heal.h"
#include "server/rpc/stall_watch.h"
#include "server/rpc/state_dict_stream.h"
#include "wire/stream_end.h"

namespace optstep {
namespace {

v1::HeldSessionRequest HeldRequest(const Session& session, uint64_t token, absl::Duration lease) {
  v1::HeldSessionRequest request;
  request.set_session_id(session.id());
  request.set_token(token);
  request.set_lease_ms(absl::ToInt64Milliseconds(lease));
  return request;
}

// Which ranks hold `key`: counters every rank, masters every rank (REPLICATED storage) or their
// owner (OWNERS), a parameter's optimizer state its owner. A key naming no parameter goes to
// rank 0, which refuses it with the reason.
std::vector<int> RanksOf(const std::string& key, const Session& session,
                         const std::map<std::string, int>& param_of) {
  const int world = session.layout().world_size;
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  if (absl::StartsWith(key, "param/") && session.config().storage == ParameterStorage::kOwners) {
    auto it = param_of.find(key.substr(6));
    if (it == param_of.end()) return {0};
    return {session.layout().owner[it->second]};
  }
  // Every rank advances every group's step counter; a parameter named "group<id>" does not
  // change that.
  if (!absl::StartsWith(key, "state/") || IsGroupStepKey(key)) return all;
  const std::optional<std::string> name = ParamNameOfKey(key);
  if (!name.has_value()) return {0};  // malformed: rank 0 names the error
  auto it = param_of.find(*name);
  if (it == param_of.end()) return {0};
  return {session.layout().owner[it->second]};
}

}  // namespace

uint64_t HeldOperations::NewToken() { return NewCheckpointSave(); }

namespace {

// How long rank 0 keeps renewing every rank's hold for a held operation: a Save or a Load whose
// ranks finish this far apart fails at its commit (ABORTED) instead of holding every step.
constexpr absl::Duration kMaxHeldByRenewal = absl::Minutes(10);

}  // namespace

absl::Status HeldOperations::WithHeldSession(Session& session, uint64_t token,
                                             const HeldOperation& op) {
  OPTSTEP_RETURN_IF_ERROR(group_->PeersStatus());
  if (options().rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint and state dict operations are served by rank 0; this is rank ",
                     options().rank));
  }
  const absl::Duration lease = options().hold_lease;
  const absl::Duration call_timeout = absl::Seconds(30);
  const v1::HeldSessionRequest base = HeldRequest(session, token, lease);
  // a. Hold: no rank starts a resolution it has not started yet. Rank 0 first: every hold is
  // taken here, so an operation that meets another (an automatic checkpoint, a second trainer's
  // import) waits for it on rank 0, for as long as a settle may take, and never meets it on the
  // other ranks.
  std::vector<uint64_t> started(options().world_size, 0);
  absl::StatusOr<uint64_t> held =
      session.holds().HoldWhenFree(token, lease, absl::Now() + options().settle_timeout);
  if (held.ok()) started[0] = *held;
  absl::Status status =
      !held.ok() ? held.status() : group_->ForEachRank([&](int r) -> absl::Status {
        if (r == 0) return absl::OkStatus();
        OPTSTEP_ASSIGN_OR_RETURN(
            v1::HeldSessionResponse response,
            group_->CallPeer(r, &v1::PeerService::Stub::HoldSession, base,
                             "waiting for the session to be held", call_timeout));
        started[r] = response.resolutions();
        return absl::OkStatus();
      });
  // b. Settle every rank at the highest resolution begun anywhere.
  std::vector<HeldPoint> points(options().world_size);
  if (status.ok()) {
    const uint64_t target = *std::max_element(started.begin(), started.end());
    v1::HeldSessionRequest settle = base;
    settle.set_target(target);
    settle.set_timeout_ms(absl::ToInt64Milliseconds(options().settle_timeout));
    status = group_->ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        OPTSTEP_ASSIGN_OR_RETURN(
            points[0],
            session.holds().Settle(token, target, absl::Now() + options().settle_timeout, lease));
        return absl::OkStatus();
      }
      OPTSTEP_ASSIGN_OR_RETURN(v1::HeldSessionResponse response,
                               group_->CallPeer(r, &v1::PeerService::Stub::SettleSession, settle,
                                                "waiting for the session to settle",
                                                options().settle_timeout + call_timeout));
      points[r] = HeldPoint{response.resolutions(), response.step(), response.skipped_steps()};
      return absl::OkStatus();
    });
  }
  for (int r = 1; r < options().world_size && status.ok(); ++r) {
    if (points[r].step != points[0].step) {
      status = absl::InternalError(absl::StrCat("session '", session.id(), "': rank ", r,
                                                " settled at step ", points[r].step,
                                                ", rank 0 at step ", points[0].step));
    }
  }
  // c. The operation, the hold renewed on every rank meanwhile: a rank that finished its part
  // (read its shard, staged its state) waits for the others, and its lease would pass. Renewal
  // stops at the first rank whose hold is gone (an automatic checkpoint lets each rank's go once
  // it has its snapshot), and after kMaxHeldByRenewal (a call that hangs on a stalled disk must
  // not stop the steps for its whole deadline); an operation that needs the hold to its end
  // finds out as it commits or applies (RenewEverywhere). A renewal lost on the way is made
  // again at the next turn.
  if (status.ok()) {
    absl::Notification done;
    std::thread renewing([&] {
      const absl::Time until = absl::Now() + kMaxHeldByRenewal;
      while (!done.WaitForNotificationWithTimeout(lease / 3) && absl::Now() < until) {
        const absl::Status renewed = RenewEverywhere(session, token);
        if (renewed.ok() || absl::IsUnavailable(renewed) || absl::IsDeadlineExceeded(renewed)) {
          continue;
        }
        VLOG(1) << "session " << session.id() << ": renewing hold " << token
                << " stopped: " << renewed;
        return;
      }
    });
    status = op(token, points[0]);
    done.Notify();
    renewing.join();
  }
  // d. Release, whatever happened (a rank that missed it lets go when its lease passes): the
  // other ranks first and rank 0 last, so that an operation waiting for this one on rank 0 (a.)
  // finds the other ranks free when it gets rank 0.
  (void)group_->ForEachRank([&](int r) -> absl::Status {
    if (r == 0) return absl::OkStatus();
    absl::StatusOr<v1::HeldSessionResponse> released =
        group_->CallPeer(r, &v1::PeerService::Stub::ReleaseSession, base,
                         "waiting for the session to be released", call_timeout);
    if (!released.ok()) LOG(WARNING) << "releasing hold: " << released.status();
    return absl::OkStatus();
  });
  absl::Status released = session.holds().Release(token);
  LOG_IF(WARNING, !released.ok()) << "releasing hold on rank 0: " << released;
  return status;
}

absl::StatusOr<std::shared_ptr<const StateDict>> HeldOperations::ExportStateDict(
    Session& session, const std::vector<uint32_t>& model_chunks) {
  std::vector<std::shared_ptr<const StateDict>> parts(options().world_size);
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint&) {
    return group_->ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        StateSelection all;
        all.model_chunks = model_chunks;
        OPTSTEP_ASSIGN_OR_RETURN(parts[0],
                                 session.holds().ExportHeld(token, all, options().hold_lease));
        return absl::OkStatus();
      }
      OPTSTEP_ASSIGN_OR_RETURN(parts[r], ExportFrom(r, session, token, model_chunks));
      return absl::OkStatus();
    });
  }));
  auto merged = std::make_shared<StateDict>();
  for (const auto& part : parts) merged->insert(part->begin(), part->end());
  return std::shared_ptr<const StateDict>(std::move(merged));
}

absl::Status HeldOperations::ImportStateDict(Session& session,
                                             std::shared_ptr<const StateDict> state) {
  // A step never makes a master or a state value that is not finite (a step whose gradients are
  // not finite is skipped): one sent from outside would poison the session for good.
  for (const auto& [key, tensor] : *state) {
    if (tensor.type != StateTensor::Type::kF32) continue;
    OPTSTEP_RETURN_IF_ERROR(CheckFiniteValues(absl::StrCat("state dict key '", key, "'"), "value",
                                              0, DType::kF32, tensor.bytes.data(),
                                              static_cast<int64_t>(tensor.bytes.size() / 4)));
  }
  std::map<std::string, int> param_of;
  for (size_t p = 0; p < session.config().params.size(); ++p) {
    param_of[session.config().params[p].name] = static_cast<int>(p);
  }
  std::vector<std::shared_ptr<StateDict>> parts(options().world_size);
  for (auto& part : parts) part = std::make_shared<StateDict>();
  for (const auto& [key, tensor] : *state) {
    for (int r : RanksOf(key, session, param_of)) (*parts[r])[key] = tensor;
  }
  return WithHeldSession(session, [&](uint64_t token, const HeldPoint& point) -> absl::Status {
    // Every rank validates and stages its part; only then does any rank change.
    OPTSTEP_RETURN_IF_ERROR(group_->ForEachRank([&](int r) -> absl::Status {
      if (r == 0) return session.holds().StageState(token, parts[0], /*complete=*/false);
      return StageOn(r, session, token, *parts[r]);
    }));
    // The timeline is left from the step the import sets, or the session's if lower.
    const std::optional<uint64_t> imported = StateDictStep(*state);
    return ApplyEverywhere(session, token, std::min(point.step, imported.value_or(point.step)));
  });
}

absl::StatusOr<std::shared_ptr<const StateDict>> HeldOperations::ExportFrom(
    int rank, const Session& session, uint64_t token, const std::vector<uint32_t>& model_chunks) {
  v1::HeldSessionRequest request = HeldRequest(session, token, options().hold_lease);
  for (uint32_t chunk : model_chunks) request.add_model_chunks(chunk);
  StateDictAssembler assembler;
  OPTSTEP_RETURN_IF_ERROR(group_->ReadState(
      rank, absl::StrCat("exporting the state of session '", session.id(), "'"),
      [&](v1::PeerService::Stub& stub, grpc::ClientContext* context) {
        return stub.ExportHeldState(context, request);
      },
      assembler));
  return assembler.Build(session);
}

absl::Status HeldOperations::StageOn(int rank, const Session& session, uint64_t token,
                                     const StateDict& part) {
  grpc::ClientContext context;
  StallWatch watch(&context, options().timeout);  // a peer that stops reading (it hangs)
  v1::HeldSessionResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::HeldStateChunk>> writer =
      group_->Peer(rank)->StageHeldState(&context, &response);
  // The first message names the session and the hold, even when this rank has no part to stage.
  v1::HeldStateChunk message;
  message.set_session_id(session.id());
  message.set_token(token);
  bool open = writer->Write(message);
  message.clear_session_id();
  StreamTally tally;
  for (auto it = part.begin(); open && it != part.end(); ++it) {
    open = ForEachStateChunk({"", "", it->first, &it->second}, message.mutable_chunk(), [&] {
      tally.Add(message.chunk().data());
      if (!writer->Write(message)) return false;
      watch.Progressed();
      return true;
    });
  }
  if (open) {
    message.Clear();
    *message.mutable_end() = tally.End(part.size());
    writer->Write(message);
  }
  writer->WritesDone();
  return watch.Explain(PeerStatus(rank, writer->Finish()), rank,
                       absl::StrCat("staging the state of session '", session.id(), "'"));
}

absl::Status HeldOperations::RenewEverywhere(Session& session, uint64_t token) {
  v1::HeldSessionRequest renew = HeldRequest(session, token, options().hold_lease);
  renew.set_renew(true);
  return group_->ForEachRank([&](int r) -> absl::Status {
    if (r == 0) return session.holds().Renew(token, options().hold_lease);
    return group_
        ->CallPeer(r, &v1::PeerService::Stub::HoldSession, renew,
                   "waiting for the session's hold to be renewed", absl::Seconds(30))
        .status();
  });
}

absl::Status HeldOperations::ApplyEverywhere(Session& session, uint64_t token,
                                             std::optional<uint64_t> abandoned_from,
                                             std::optional<uint64_t> kept_step) {
  // Before any rank applies: a restart between the apply and the checkpointer's next look would
  // otherwise restore the timeline left (its highest step) over the state put in its place.
  // Before the renewal too, so that the disk's time does not run down the holds' lease.
  RankGroupOptions::ReplacementDone replacing;
  if (options().replacing_state && abandoned_from.has_value()) {
    OPTSTEP_ASSIGN_OR_RETURN(replacing,
                             options().replacing_state(session.id(), *abandoned_from, kept_step));
  }
  bool asked = false;  // whether the ranks were asked to apply (some may have)
  absl::Cleanup told = [&] {
    if (replacing) replacing(asked);
  };
  OPTSTEP_RETURN_IF_ERROR(RenewEverywhere(session, token));
  asked = true;
  OPTSTEP_RETURN_IF_ERROR(group_->ForEachRank([&](int r) -> absl::Status {
    if (r == 0) return session.holds().ApplyStaged(token);
    return group_
        ->CallPeer(r, &v1::PeerService::Stub::ApplyHeldState,
                   HeldRequest(session, token, options().hold_lease),
                   "waiting for its staged state to be applied", kApplyCallTimeout)
        .status();
  }));
  if (!options().heal || options().world_size < 2) return absl::OkStatus();
  // Each rank's shadow reflected its predecessor's state before the import: fetched again, still
  // under the hold, so that a rank lost from now on heals; made again while it fails for a
  // passing reason and the rank answers (before, once: a connection reset left the shadow stale
  // for good, and the next loss of its owner restarted the group). A shadow that could not be
  // is refused by a heal (the group then restarts from its checkpoints); the import stands.
  // Not once a rank is lost or a heal begins (the predecessor fetched from, most likely, which
  // the rank asked does not answer for): the refresh then fails at once.
  const auto while_whole = [this](absl::Status status) {
    const absl::Status whole = status.ok() ? absl::OkStatus() : group_->PeersStatus();
    if (whole.ok()) return status;
    return absl::FailedPreconditionError(
        absl::StrCat(status.message(), " (", whole.message(), ")"));
  };
  const int world_size = options().world_size;
  const absl::Status refreshed = group_->ForEachRank([&](int r) -> absl::Status {
    if (r == 0) {
      // Rank 0 fetches its predecessor's state itself.
      return group_->CallUntilTaken(world_size - 1, "FetchOwnedState", [&] {
        return while_whole(RefreshShadow(session, 0, world_size, PeerFetch(group_)));
      });
    }
    return group_->CallUntilTaken(r, "RefreshShadow", [&] {
      return while_whole(group_
                             ->CallPeer(r, &v1::PeerService::Stub::RefreshShadow,
                                        HeldRequest(session, token, options().hold_lease),
                                        "waiting for its shadow to be fetched again",
                                        kApplyCallTimeout)
                             .status());
    });
  });
  LOG_IF(WARNING, !refreshed.ok()) << "event=shadow_refresh_failed session=" << session.id()
                                   << " error=\"" << LogValue(refreshed.message()) << "\"";
  return absl::OkStatus();
}

absl::StatusOr<CheckpointLocation> HeldOperations::Locate(const std::string& name,
                                                          bool allow_auto) const {
  if (options().checkpoint_root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options().rank, " has no checkpoint root: start it with --checkpoint_root"));
  }
  return LocateCheckpoint(options().checkpoint_root, name, allow_auto);
}

absl::StatusOr<uint64_t> HeldOperations::SaveCheckpoint(
    Session& session, const std::string& name, const CheckpointProgressCallback& progress) {
  OPTSTEP_ASSIGN_OR_RETURN(const CheckpointLocation where, Locate(name, /*allow_auto=*/false));
  OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(session));
  // What crashed saves left (the start-up sweep keeps temporaries younger than the bound, and a
  // healed rank 0 may not start again for days): each would hold most of a checkpoint's bytes.
  if (options().checkpoint_temp_max_age > absl::ZeroDuration()) {
    absl::StatusOr<std::vector<std::string>> swept =
        SweepStaleCheckpointTemporaries(where.root, options().checkpoint_temp_max_age);
    LOG_IF(WARNING, !swept.ok()) << "--checkpoint_root: " << swept.status();
  }
  uint64_t step = 0;
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint& point) {
    OPTSTEP_RETURN_IF_ERROR(PrepareCheckpoint(where.root, where.name, token));
    absl::Status saved = SaveShardsAndCommit(session, token, point, where, definition, progress);
    if (!saved.ok()) {
      // Every rank's failure path removed its own shard; the temporary goes with the rest.
      absl::Status removed = AbandonCheckpoint(where.root, where.name, token);
      if (!removed.ok()) LOG(WARNING) << "removing the temporary of a failed save: " << removed;
    }
    step = point.step;
    return saved;
  }));
  return step;
}

absl::Status HeldOperations::SaveShardsAndCommit(Session& session, uint64_t token,
                                                 const HeldPoint& point,
                                                 const CheckpointLocation& where,
                                                 const std::string& definition,
                                                 const CheckpointProgressCallback& progress) {
  const std::string& name = where.name;
  std::vector<ShardFile> shards(options().world_size);
  std::atomic<int> files_done{0};
  OPTSTEP_RETURN_IF_ERROR(group_->ForEachRank([&](int r) -> absl::Status {
    if (r == 0) {
      OPTSTEP_ASSIGN_OR_RETURN(
          shards[0], WriteHeldShard(session, token, where, [&](const CheckpointProgress& p) {
            (void)session.holds().Renew(token, options().hold_lease);  // renews the lease
            CheckpointProgress all = p;
            all.files_done = files_done.load();
            all.files_total = options().world_size;
            if (progress) progress(all);
          }));
    } else {
      v1::HeldSessionRequest request = HeldRequest(session, token, options().hold_lease);
      request.set_checkpoint_name(name);
      OPTSTEP_ASSIGN_OR_RETURN(
          v1::HeldSessionResponse response,
          group_->CallPeer(r, &v1::PeerService::Stub::SaveShard, request,
                           "waiting for its shard to be written", kShardCallTimeout));
      shards[r] = ShardFile{response.shard_file(), response.shard_bytes(), response.shard_crc32c()};
    }
    ++files_done;
    return absl::OkStatus();
  }));
  // Every rank still holds the session: none stepped while the shards were written.
  OPTSTEP_RETURN_IF_ERROR(RenewEverywhere(session, token));
  return CommitSessionCheckpoint(session, token, point, where, definition, shards,
                                 options().keep_checkpoints);
}

absl::StatusOr<uint64_t> HeldOperations::LoadCheckpoint(Session& session, const std::string& name,
                                                        const CheckpointProgressCallback& progress,
                                                        bool restoring) {
  OPTSTEP_ASSIGN_OR_RETURN(const CheckpointLocation where, Locate(name, /*allow_auto=*/true));
  OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(session));
  uint64_t step = 0;
  OPTSTEP_RETURN_IF_ERROR(WithHeldSession(session, [&](uint64_t token, const HeldPoint& point) {
    // Every rank verifies and stages; only when all succeeded does any rank apply.
    OPTSTEP_RETURN_IF_ERROR(group_->ForEachRank([&](int r) -> absl::Status {
      if (r == 0) {
        OPTSTEP_ASSIGN_OR_RETURN(
            step,
            StageCheckpoint(session, token, where, definition, [&](const CheckpointProgress& p) {
              (void)session.holds().Renew(token, options().hold_lease);
              if (progress) progress(p);
            }));
        return absl::OkStatus();
      }
      v1::HeldSessionRequest request = HeldRequest(session, token, options().hold_lease);
      request.set_checkpoint_name(name);
      return group_
          ->CallPeer(r, &v1::PeerService::Stub::StageCheckpoint, request,
                     "waiting for its shard to be read and staged", kShardCallTimeout)
          .status();
    }));
    // The timeline is left from the step loaded, or the session's if lower; after the step
    // loaded when that is the session's own automatic checkpoint of it, which holds the new
    // timeline's state too. A restore sets aside what it passed over itself
    // (AutoCheckpointer::Restored, and the damaged ones it keeps for an operator).
    if (restoring) return ApplyEverywhere(session, token, std::nullopt);
    if (name == AutoCheckpointName(session.id(), step) && step <= point.step) {
      return ApplyEverywhere(session, token, step + 1, step);
    }
    return ApplyEverywhere(session, token, std::min(point.step, step));
  }));
  return step;
}

}  // namespace optstep
