#ifndef OPTSTEP_SERVER_RPC_RENDEZVOUS_H_
#define OPTSTEP_SERVER_RPC_RENDEZVOUS_H_

// The rendezvous of a group of ranks (docs/design.md §7): rank 0 serves a small key-value store
// (RendezvousServiceImpl); every rank reaches it through GrpcKeyValueStore, which is the
// KeyValueStore its communicators connect through.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/comm/key_value_store.h"
#include "optstep/v1/internal.grpc.pb.h"

namespace optstep {

// Serves the store from memory. Get waits (on its own thread, never on a gRPC reaction) until
// the key is set or the request's timeout passes. Thread-safe.
class RendezvousServiceImpl final : public v1::RendezvousService::CallbackService {
 public:
  RendezvousServiceImpl();

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::RendezvousSetRequest* request,
                                v1::RendezvousSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::RendezvousGetRequest* request,
                                v1::RendezvousGetResponse* response) override;

 private:
  std::shared_ptr<KeyValueStore> store_;
};

// A KeyValueStore backed by rank 0's RendezvousService at `target`. Calls wait for the channel
// to become ready (rank 0 may start after this rank), up to their deadline. Thread-safe.
class GrpcKeyValueStore final : public KeyValueStore {
 public:
  // `credentials`: how to reach rank 0 (TLS, token); null: insecure.
  explicit GrpcKeyValueStore(const std::string& target,
                             std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  // Set, waiting at most `timeout` for rank 0 (DEADLINE_EXCEEDED while it is away).
  absl::Status SetWithin(const std::string& key, const std::string& value, absl::Duration timeout);

  // The value of `key` if set, asked of a store that may not be there: no wait for the channel,
  // an answer within `within` (UNAVAILABLE or DEADLINE_EXCEEDED while nothing serves it).
  absl::StatusOr<std::string> Peek(const std::string& key, absl::Duration within);

  // The store served at `target` from now on: a stand-in for rank 0 serves its own (calls under
  // way finish on the earlier one).
  void Retarget(const std::string& target);
  std::string target() const;

 private:
  std::shared_ptr<v1::RendezvousService::Stub> stub() const;

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  mutable absl::Mutex mu_;
  std::string target_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<v1::RendezvousService::Stub> stub_ ABSL_GUARDED_BY(mu_);
};

// Store key under which rank `rank` publishes its gRPC address.
std::string RankAddressKey(int rank);

// Channel arguments of the calls between ranks: a peer that restarted is reconnected to within
// a second of listening again (gRPC's default backoff grows to two minutes while it is away).
void SetFastReconnect(grpc::ChannelArguments& args);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_RENDEZVOUS_H_
