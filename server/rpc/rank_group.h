#ifndef OPTSTEP_SERVER_RPC_RANK_GROUP_H_
#define OPTSTEP_SERVER_RPC_RANK_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/serial_executor.h"
#include "checkpoint/checkpoint_writer.h"
#include "kernels/comm/key_value_store.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "optstep/v1/session.pb.h"
#include "server/engine/engine.h"

namespace optstep {

struct RankGroupOptions {
  int rank = 0;
  int world_size = 1;
  // Rendezvous and replica creation give up after this.
  absl::Duration timeout = absl::Seconds(120);
  // Checkpoint directories of Save / Load (a shared file system); empty: Save and Load answer
  // FAILED_PRECONDITION. keep_checkpoints: how many complete checkpoints Save keeps (0: all).
  std::string checkpoint_root;
  int keep_checkpoints = 0;
  // A hold (docs/checkpoints.md) ends by itself this long after its last call or progress.
  absl::Duration hold_lease = absl::Seconds(30);
  // How long ranks may take to reach the resolution a hold settles at (a step may still wait for
  // its trainers or its deadline).
  absl::Duration settle_timeout = absl::Seconds(120);
  // How this rank calls the others (TLS, token); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
};

// The session lifecycle across the ranks of a group. Rank 0 allots session ids and creates each
// session on every rank (its peers through PeerService.CreateReplica, itself through its engine),
// so that every rank holds a replica with the same id and joins the same communicator group.
// Thread-safe. Calls block (rendezvous, connecting); never call them on a gRPC reaction.
class RankGroup {
 public:
  // With several ranks, relays the abort votes of this rank's sessions (RelayAbortVote).
  RankGroup(RankGroupOptions options, Engine* engine);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const RankGroupOptions& options() const { return options_; }

  // Publishes this rank's address ("host:port" the other ranks and trainers reach it at) in the
  // store; rank 0 also waits for every other rank's.
  // `store` is the group's rendezvous store (rank 0's RendezvousService); unused for world size 1.
  absl::Status Join(const std::string& advertise_address, std::shared_ptr<KeyValueStore> store);
  // The address of every rank, by rank (after Join on rank 0).
  std::vector<std::string> addresses() const;

  // Rank 0: creates (or attaches by name to) a session on every rank. FAILED_PRECONDITION on
  // other ranks. On failure the replicas already made are closed again.
  absl::StatusOr<Engine::Created> CreateSession(const v1::SessionSpec& spec);
  // Rank 0: closes the session on every rank (the peers' errors are logged, not returned).
  absl::Status CloseSession(const std::string& id);

  // Rank 0, for operations that must see one step on every rank (docs/checkpoints.md, "RPCs and
  // consistency"): holds `session` on every rank, settles them at the highest resolution any of
  // them started, runs `op` with the hold's token and the settled point, and releases every
  // rank whatever happened. Blocks.
  using HeldOperation = std::function<absl::Status(uint64_t token, const HeldPoint& point)>;
  absl::Status WithHeldSession(Session& session, const HeldOperation& op);

  // Rank 0: the state dict of `model_chunks` (all when empty) gathered from every rank at one
  // step: every master from rank 0, each parameter's optimizer state from its owner.
  absl::StatusOr<std::shared_ptr<const StateDict>> ExportStateDict(
      Session& session, const std::vector<uint32_t>& model_chunks);
  // Rank 0: routes each key to the ranks that hold it (masters and counters: every rank; state:
  // the owner), has every rank validate and stage its part, and only then applies everywhere.
  absl::Status ImportStateDict(Session& session, std::shared_ptr<const StateDict> state);
  // Rank 0: checkpoint `name` under every rank's checkpoint root. Answers the step saved.
  absl::StatusOr<uint64_t> SaveCheckpoint(Session& session, const std::string& name,
                                          const CheckpointProgressCallback& progress);
  // Rank 0: every rank verifies and stages its part of checkpoint `name`; then every rank
  // applies it. Answers the step restored.
  absl::StatusOr<uint64_t> LoadCheckpoint(Session& session, const std::string& name,
                                          const CheckpointProgressCallback& progress);

  // A session voted to abort `step` as its resolution `resolution` (on this rank, or on the
  // rank that called this one's PeerService.AbortStep): tells rank 0, which tells every other
  // rank, so that all of them meet the vote. Returns at once; the calls run on their own thread.
  void RelayAbortVote(const std::string& session_id, uint64_t resolution, uint64_t step);

 private:
  v1::PeerService::Stub* Peer(int rank);
  // Learns rank r's address from the store unless known (ranks other than 0 know only theirs).
  absl::Status EnsureAddress(int rank);
  // Runs `call(r)` for every rank at once (rank 0 on this thread); the lowest rank's error.
  absl::Status ForEachRank(const std::function<absl::Status(int rank)>& call);
  using HeldMethod = grpc::Status (v1::PeerService::Stub::*)(grpc::ClientContext*,
                                                             const v1::HeldSessionRequest&,
                                                             v1::HeldSessionResponse*);
  absl::StatusOr<v1::HeldSessionResponse> CallPeer(int rank, HeldMethod method,
                                                   const v1::HeldSessionRequest& request,
                                                   absl::Duration timeout);
  absl::Status CheckCheckpointRoot(const std::string& name) const;
  // Every rank writes the state it staged under `token`.
  absl::Status ApplyEverywhere(Session& session, uint64_t token);

  const RankGroupOptions options_;
  Engine* const engine_;

  // Serialises session creation on rank 0, so that two trainers creating the same named
  // session at once attach to one session with one id on every rank.
  absl::Mutex create_mu_;

  mutable absl::Mutex mu_;
  std::shared_ptr<KeyValueStore> store_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<v1::PeerService::Stub>> peers_ ABSL_GUARDED_BY(mu_);
  // Runs RelayAbortVote's calls in order (declared last: joined first).
  std::unique_ptr<SerialExecutor> relay_;
};

// The session's definition as JSON text (its SessionSpec without the name, which only serves
// to attach): what a checkpoint records and compares by digest.
absl::StatusOr<std::string> DefinitionJson(const Session& session);

// PeerService: replicas of rank 0's sessions on this rank, and this rank's part of held
// operations. `group` (this rank's options) may be null: no checkpoint root.
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

 private:
  // Runs `work` on its own thread (holds and file IO block) and finishes the call with it.
  using HeldWork = std::function<absl::Status(Session& session)>;
  grpc::ServerUnaryReactor* Detached(grpc::CallbackServerContext* context,
                                     const v1::HeldSessionRequest& request, HeldWork work);
  absl::Duration Lease(const v1::HeldSessionRequest& request) const;
  // This rank's --checkpoint_root; FAILED_PRECONDITION when unset.
  absl::StatusOr<std::string> CheckpointRoot(const Session& session) const;

  Engine* const engine_;
  RankGroup* const group_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_RANK_GROUP_H_
