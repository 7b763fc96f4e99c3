#include "server/rpc/peer_service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/run_detached.h"
#include "base/status_macros.h"
#include "server/engine/session_checkpoint.h"
#include "server/rpc/convert.h"
#include "server/rpc/heal.h"
#include "server/rpc/state_dict_stream.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

// A heal call to a rank that has no group (one rank alone, or a test's bare service).
grpc::ServerUnaryReactor* FinishWithoutGroup(grpc::ServerUnaryReactor* reactor) {
  reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this rank has no group"));
  return reactor;
}

// How long a rank other than 0 waits for another operation's hold to be released before it
// refuses a new one (ABORTED): the release follows the operation's end by one call.
constexpr absl::Duration kPeerHoldWait = absl::Seconds(10);

}  // namespace

grpc::ServerUnaryReactor* PeerServiceImpl::CreateReplica(grpc::CallbackServerContext* context,
                                                         const v1::CreateReplicaRequest* request,
                                                         v1::CreateReplicaResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // A rank waiting for rank 0's next process keeps the sessions that process heals itself in
  // with; one made meanwhile (a creation the new process took before it healed) would be made in
  // this rank's old generation, beside them.
  if (group_ != nullptr && group_->AwaitsRankZero()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat("rank ", group_->rank(), " waits for rank 0 to heal itself in")));
    return reactor;
  }
  // Joining the group blocks until every rank arrives: not on the reaction.
  // A replica made by a heal this rank runs waits for the heal's end, as the others do.
  std::optional<uint64_t> healing;
  if (group_ != nullptr && group_->healing()) healing = group_->generation();
  RunDetached([engine = engine_, request, reactor, healing] {
    reactor->Finish(ToGrpcStatus(CreateReplicaHere(engine, *request, healing)));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::CloseReplica(grpc::CallbackServerContext* context,
                                                        const v1::CloseReplicaRequest* request,
                                                        v1::CloseReplicaResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(engine_->CloseSession(request->session_id())));
  return reactor;
}

absl::StatusOr<std::string> PeerServiceImpl::CheckpointRoot(const Session& session) const {
  const std::string root = group_ == nullptr ? "" : group_->options().checkpoint_root;
  if (root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", session.rank(), " has no checkpoint root: start it with --checkpoint_root"));
  }
  return root;
}

absl::Duration PeerServiceImpl::Lease(const v1::HeldSessionRequest& request) const {
  return request.lease_ms() > 0 ? absl::Milliseconds(request.lease_ms()) : absl::Seconds(30);
}

grpc::ServerUnaryReactor* PeerServiceImpl::Detached(grpc::CallbackServerContext* context,
                                                    const v1::HeldSessionRequest& request,
                                                    HeldWork work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunDetached([engine = engine_, id = request.session_id(), reactor, work = std::move(work)] {
    absl::StatusOr<std::shared_ptr<Session>> session = engine->GetSession(id);
    reactor->Finish(ToGrpcStatus(session.ok() ? work(**session) : session.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::AbortStep(grpc::CallbackServerContext* context,
                                                     const v1::HeldSessionRequest* request,
                                                     v1::HeldSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(request->session_id());
  if (session.ok()) {
    (*session)->JoinAbort(request->target(), request->step());
    if (group_ != nullptr && group_->rank() == 0) {
      group_->RelayAbortVote(request->session_id(), request->target(), request->step());
    }
  }
  reactor->Finish(ToGrpcStatus(session.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::Ping(grpc::CallbackServerContext* context,
                                                const v1::PingRequest* request,
                                                v1::PingResponse* response) {
  if (group_ != nullptr) {
    response->set_rank(group_->rank());
    response->set_incarnation(group_->incarnation());
    response->set_group_formed(group_->rank() == 0 && group_->formed());
    // A rank that says it knows (its next heartbeat after the answer that told it): an answer
    // that reached it too late, a probe's ping or a leaving rank's is not counted.
    if (response->group_formed() && request->knows_group_formed() && !request->leaving()) {
      group_->NoteFormedSeen(static_cast<int>(request->rank()));
    }
    response->set_generation(group_->generation());
    response->set_healing(group_->healing());
    if (group_->rank() == 1) response->set_rank_zero_stand_in(group_->rank_zero_stand_in());
    if (request->leaving()) group_->PeerLeft(static_cast<int>(request->rank()));
    if (!request->rendezvous().empty()) group_->HearOfRendezvous(request->rendezvous());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::Rejoin(grpc::CallbackServerContext* context,
                                                  const v1::RejoinRequest* request,
                                                  v1::RejoinResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (group_ == nullptr) return FinishWithoutGroup(reactor);
  // The heal blocks on every rank's communicators and the state transfer: not on the reaction.
  RunDetached([engine = engine_, group = group_, request, response, reactor] {
    absl::StatusOr<uint64_t> generation = HealRejoinedRank(engine, group, *request);
    if (generation.ok()) response->set_generation(*generation);
    reactor->Finish(ToGrpcStatus(generation.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::Regroup(grpc::CallbackServerContext* context,
                                                   const v1::RegroupRequest* request,
                                                   v1::RegroupResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (group_ == nullptr) return FinishWithoutGroup(reactor);
  // Rebuilding the communicators blocks until every rank arrives; the transfer and the catch-up
  // read peers.
  RunDetached([engine = engine_, group = group_, request, reactor] {
    absl::Status status;
    const v1::RegroupRequest::Phase phase = request->phase();
    if (phase == v1::RegroupRequest::PHASE_TRANSFER ||
        phase == v1::RegroupRequest::PHASE_CATCH_UP) {
      status = group->CheckHealing(request->generation());
      if (status.ok() && phase == v1::RegroupRequest::PHASE_TRANSFER) {
        status = TakeStateFromPeers(engine, group->rank(), group->world_size(), PeerFetch(group));
      } else if (status.ok()) {
        status = CatchUpFromPeers(
            engine, group,
            CatchUpSources(request->catch_up_from().begin(), request->catch_up_from().end()));
      }
    } else {
      status = group->Regroup(*request);
      const bool healed = request->phase() == v1::RegroupRequest::PHASE_END && !request->failed();
      if (status.ok() && healed) ResumeSessions(engine, request->generation());
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::ListReplicas(grpc::CallbackServerContext* context,
                                                        const v1::ListReplicasRequest* request,
                                                        v1::ListReplicasResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (group_ == nullptr) return FinishWithoutGroup(reactor);
  absl::StatusOr<v1::ListReplicasResponse> listed =
      optstep::ListReplicas(engine_, *group_, *request);
  if (listed.ok()) *response = *std::move(listed);
  reactor->Finish(ToGrpcStatus(listed.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerServiceImpl::RefreshShadow(grpc::CallbackServerContext* context,
                                                         const v1::HeldSessionRequest* request,
                                                         v1::HeldSessionResponse*) {
  return Detached(context, *request, [group = group_](Session& s) -> absl::Status {
    if (group == nullptr) return absl::FailedPreconditionError("this rank has no group");
    return optstep::RefreshShadow(s, group->rank(), group->world_size(), PeerFetch(group));
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::HoldSession(grpc::CallbackServerContext* context,
                                                       const v1::HeldSessionRequest* request,
                                                       v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    if (request->renew()) return s.holds().Renew(request->token(), Lease(*request));
    // Rank 0 holds first (HeldOperations::WithHeldSession), so another operation's hold here is
    // one whose release is still on its way: waited for, briefly, as rank 0 waited.
    OPTSTEP_ASSIGN_OR_RETURN(
        uint64_t started,
        s.holds().HoldWhenFree(request->token(), Lease(*request), absl::Now() + kPeerHoldWait));
    response->set_resolutions(started);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::SettleSession(grpc::CallbackServerContext* context,
                                                         const v1::HeldSessionRequest* request,
                                                         v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(
        HeldPoint point,
        s.holds().Settle(request->token(), request->target(),
                         absl::Now() + absl::Milliseconds(request->timeout_ms()), Lease(*request)));
    response->set_resolutions(point.resolutions);
    response->set_step(point.step);
    response->set_skipped_steps(point.skipped_steps);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::ReleaseSession(grpc::CallbackServerContext* context,
                                                          const v1::HeldSessionRequest* request,
                                                          v1::HeldSessionResponse*) {
  return Detached(context, *request,
                  [request](Session& s) { return s.holds().Release(request->token()); });
}

grpc::ServerUnaryReactor* PeerServiceImpl::ApplyHeldState(grpc::CallbackServerContext* context,
                                                          const v1::HeldSessionRequest* request,
                                                          v1::HeldSessionResponse*) {
  return Detached(context, *request,
                  [request](Session& s) { return s.holds().ApplyStaged(request->token()); });
}

grpc::ServerWriteReactor<v1::StateDictChunk>* PeerServiceImpl::ExportHeldState(
    grpc::CallbackServerContext*, const v1::HeldSessionRequest* request) {
  // Between ranks: the calling rank bounds its own wait (StallWatch).
  return NewStateStreamReactor(
      nullptr, absl::ZeroDuration(), "ExportHeldState",
      [engine = engine_, request = *request, lease = Lease(*request)](
          std::function<void(absl::StatusOr<StreamedState>)> deliver,
          std::function<bool()> /*ended*/) {
        RunDetached([engine, request, lease, deliver = std::move(deliver)] {
          absl::StatusOr<std::shared_ptr<Session>> session =
              engine->GetSession(request.session_id());
          if (!session.ok()) return deliver(session.status());
          StateSelection owned;
          owned.model_chunks.assign(request.model_chunks().begin(), request.model_chunks().end());
          // Rank 0 holds every master under REPLICATED storage; under OWNERS each rank sends its
          // own.
          owned.params = (*session)->config().storage == ParameterStorage::kReplicated
                             ? StateSelection::Params::kNone
                             : StateSelection::Params::kOwned;
          owned.counters = false;
          absl::StatusOr<std::shared_ptr<const StateDict>> dict =
              (*session)->holds().ExportHeld(request.token(), owned, lease);
          if (!dict.ok()) return deliver(dict.status());
          StreamedState state;
          for (const auto& [key, tensor] : **dict) state.tensors.push_back({"", "", key, &tensor});
          state.keep = *std::move(dict);
          deliver(std::move(state));
        });
      });
}

grpc::ServerReadReactor<v1::HeldStateChunk>* PeerServiceImpl::StageHeldState(
    grpc::CallbackServerContext* context, v1::HeldSessionResponse*) {
  // Between ranks: no idle bound (the hold's lease bounds a rank that stops sending).
  return NewStateDictUploadReactor<v1::HeldStateChunk>(
      engine_, RankCaller(), /*caller_key=*/"", "empty stage stream",
      CallIdleWatch::Start(context, absl::ZeroDuration(), "StageHeldState",
                           CallIdleWatch::Waits::kReads),
      /*open=*/nullptr,
      [](Session& session, uint64_t token, std::shared_ptr<const StateDict> dict, uint64_t) {
        return session.holds().StageState(token, std::move(dict), /*complete=*/false);
      });
}

grpc::ServerUnaryReactor* PeerServiceImpl::SaveShard(grpc::CallbackServerContext* context,
                                                     const v1::HeldSessionRequest* request,
                                                     v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    if (group_ != nullptr && group_->options().on_save_shard) group_->options().on_save_shard();
    OPTSTEP_ASSIGN_OR_RETURN(const std::string root, CheckpointRoot(s));
    const std::string& name = request->checkpoint_name();
    OPTSTEP_ASSIGN_OR_RETURN(const CheckpointLocation where,
                             LocateCheckpoint(root, name, /*allow_auto=*/true));
    // An automatic checkpoint is written from a snapshot, this rank's hold released first.
    OPTSTEP_ASSIGN_OR_RETURN(
        ShardFile shard,
        IsAutoCheckpointName(name)
            ? WriteSnapshotShard(s, request->token(), where, Lease(*request),
                                 [&] { (void)s.holds().Release(request->token()); })
            : WriteHeldShard(s, request->token(), where, [&](const CheckpointProgress&) {
                (void)s.holds().Renew(request->token(), Lease(*request));
              }));
    response->set_shard_file(shard.file);
    response->set_shard_bytes(shard.bytes);
    response->set_shard_crc32c(shard.crc32c);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PeerServiceImpl::StageCheckpoint(grpc::CallbackServerContext* context,
                                                           const v1::HeldSessionRequest* request,
                                                           v1::HeldSessionResponse* response) {
  return Detached(context, *request, [this, request, response](Session& s) -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(const std::string root, CheckpointRoot(s));
    OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(s));
    OPTSTEP_ASSIGN_OR_RETURN(
        const CheckpointLocation where,
        LocateCheckpoint(root, request->checkpoint_name(), /*allow_auto=*/true));
    OPTSTEP_ASSIGN_OR_RETURN(
        uint64_t step, optstep::StageCheckpoint(
                           s, request->token(), where, definition, [&](const CheckpointProgress&) {
                             (void)s.holds().Renew(request->token(), Lease(*request));
                           }));
    response->set_step(step);
    return absl::OkStatus();
  });
}

}  // namespace optstep
