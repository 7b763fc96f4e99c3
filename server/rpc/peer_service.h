#ifndef OPTSTEP_SERVER_RPC_PEER_SERVICE_H_
#define OPTSTEP_SERVER_RPC_PEER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// PeerService: what the other ranks ask of this one. Replicas of rank 0's sessions
// (RankGroup::CreateSession), this rank's part of held operations (HeldOperations), and abort
// votes (RankGroup::RelayAbortVote), and the heartbeats (PeerHeartbeat). `group` (this rank's
// options) may be null: no checkpoint root. Calls that block (holds, rendezvous, file IO) run off
// the reaction (RunDetached). Thread-safe; stateless apart from the two pointers, which must
// outlive it.
class PeerServiceImpl final : public v1::PeerService::CallbackService {
 public:
  explicit PeerServiceImpl(Engine* engine, RankGroup* group = nullptr)
      : engine_(engine), group_(group) {}

  grpc::ServerUnaryReactor* CreateReplica(grpc::CallbackServerContext* context,
                                          const v1::CreateReplicaRequest* request,
                                          v1::CreateReplicaResponse* response) override;
  grpc::ServerUnaryReactor* CloseReplica(grpc::CallbackServerContext* context,
                                         const v1::CloseReplicaRequest* request,
                                         v1::CloseReplicaResponse* response) override;
  grpc::ServerUnaryReactor* HoldSession(grpc::CallbackServerContext* context,
                                        const v1::HeldSessionRequest* request,
                                        v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* SettleSession(grpc::CallbackServerContext* context,
                                          const v1::HeldSessionRequest* request,
                                          v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSession(grpc::CallbackServerContext* context,
                                           const v1::HeldSessionRequest* request,
                                           v1::HeldSessionResponse* response) override;
  grpc::ServerWriteReactor<v1::StateDictChunk>* ExportHeldState(
      grpc::CallbackServerContext* context, const v1::HeldSessionRequest* request) override;
  grpc::ServerReadReactor<v1::HeldStateChunk>* StageHeldState(
      grpc::CallbackServerContext* context, v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* ApplyHeldState(grpc::CallbackServerContext* context,
                                           const v1::HeldSessionRequest* request,
                                           v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* SaveShard(grpc::CallbackServerContext* context,
                                      const v1::HeldSessionRequest* request,
                                      v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* StageCheckpoint(grpc::CallbackServerContext* context,
                                            const v1::HeldSessionRequest* request,
                                            v1::HeldSessionResponse* response) override;
  grpc::ServerUnaryReactor* AbortStep(grpc::CallbackServerContext* context,
                                      const v1::HeldSessionRequest* request,
                                      v1::HeldSessionResponse* response) override;
  // Answers at once; a caller that is `leaving` is counted as gone (RankGroup::PeerLeft).
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override;
  // State redundancy (heal.h, PeerFetch; served in peer_state_fetch.cc):
  // Session::ExportOwnedState, ExportShadow, ExportMasters streamed.
  grpc::ServerWriteReactor<v1::StateDictChunk>* FetchOwnedState(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  grpc::ServerWriteReactor<v1::StateDictChunk>* FetchShadow(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  grpc::ServerWriteReactor<v1::StateDictChunk>* FetchMasters(
      grpc::CallbackServerContext* context, const v1::FetchStateRequest* request) override;
  // After a state import under a hold: this rank's shadow fetched again from its predecessor
  // (RefreshShadow).
  grpc::ServerUnaryReactor* RefreshShadow(grpc::CallbackServerContext* context,
                                          const v1::HeldSessionRequest* request,
                                          v1::HeldSessionResponse* response) override;
  // Rank 0: heals the restarted rank into the group (HealRejoinedRank); answers once it is done.
  grpc::ServerUnaryReactor* Rejoin(grpc::CallbackServerContext* context,
                                   const v1::RejoinRequest* request,
                                   v1::RejoinResponse* response) override;
  // Whether this rank waits for rank 0's heal, and its sessions (heal.h, ListReplicas).
  grpc::ServerUnaryReactor* ListReplicas(grpc::CallbackServerContext* context,
                                         const v1::ListReplicasRequest* request,
                                         v1::ListReplicasResponse* response) override;
  // This rank's part of a heal (RankGroup::Regroup).
  grpc::ServerUnaryReactor* Regroup(grpc::CallbackServerContext* context,
                                    const v1::RegroupRequest* request,
                                    v1::RegroupResponse* response) override;

 private:
  // Runs `work` on its own thread (holds and file IO block) and finishes the call with it.
  using HeldWork = std::function<absl::Status(Session& session)>;
  grpc::ServerUnaryReactor* Detached(grpc::CallbackServerContext* context,
                                     const v1::HeldSessionRequest& request, HeldWork work);
  absl::Duration Lease(const v1::HeldSessionRequest& request) const;
  // Streams what `start` exports of the request's session.
  using SessionExport = void (Session::*)(Session::StateCallback);
  grpc::ServerWriteReactor<v1::StateDictChunk>* StreamExport(const v1::FetchStateRequest& request,
                                                             SessionExport start);
  // This rank's --checkpoint_root; FAILED_PRECONDITION when unset.
  absl::StatusOr<std::string> CheckpointRoot(const Session& session) const;

  Engine* const engine_;
  RankGroup* const group_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PEER_SERVICE_H_
