#ifndef OPTSTEP_SERVER_RPC_RANK_GROUP_H_
#define OPTSTEP_SERVER_RPC_RANK_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
};

// The session lifecycle across the ranks of a group. Rank 0 allots session ids and creates each
// session on every rank (its peers through PeerService.CreateReplica, itself through its engine),
// so that every rank holds a replica with the same id and joins the same communicator group.
// Thread-safe. Calls block (rendezvous, connecting); never call them on a gRPC reaction.
class RankGroup {
 public:
  RankGroup(RankGroupOptions options, Engine* engine);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }

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

 private:
  v1::PeerService::Stub* Peer(int rank);

  const RankGroupOptions options_;
  Engine* const engine_;

  // Serialises session creation on rank 0, so that two trainers creating the same named
  // session at once attach to one session with one id on every rank.
  absl::Mutex create_mu_;

  mutable absl::Mutex mu_;
  std::shared_ptr<KeyValueStore> store_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<v1::PeerService::Stub>> peers_ ABSL_GUARDED_BY(mu_);
};

// PeerService: replicas of rank 0's sessions on this rank.
class PeerServiceImpl final : public v1::PeerService::CallbackService {
 public:
  explicit PeerServiceImpl(Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* CreateReplica(grpc::CallbackServerContext* context,
                                          const v1::CreateReplicaRequest* request,
                                          v1::CreateReplicaResponse* response) override;
  grpc::ServerUnaryReactor* CloseReplica(grpc::CallbackServerContext* context,
                                         const v1::CloseReplicaRequest* request,
                                         v1::CloseReplicaResponse* response) override;

 private:
  Engine* const engine_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_RANK_GROUP_H_
