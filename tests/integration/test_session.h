#ifndef OPTSTEP_TESTS_INTEGRATION_TEST_SESSION_H_
#define OPTSTEP_TESTS_INTEGRATION_TEST_SESSION_H_

// A small session and its steps for the integration tests of the server's operations (security,
// metrics, limits, lifecycle), plus a Step stream driven by hand to hold a step open.

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/testing/server_process.h"

namespace optstep {
namespace testutil {

// A real server process (ServerProcess::Start with `flags`) and a client connected to it.
struct ConnectedServer {
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<Client> client;
};
absl::StatusOr<ConnectedServer> StartConnected(std::vector<std::string> flags = {});

// fc.weight [8, 4] and fc.bias [8]: 40 fp32 elements; one trainer, SHARDED, Adam.
v1::SessionSpec SmallSpec(const std::string& name);
inline constexpr int kSmallElements = 40;

// Step `step` of trainer `trainer` of a SmallSpec session, with deterministic fp32 gradients.
absl::StatusOr<StepReply> StepSmall(Client& client, const std::string& session_id, uint64_t step,
                                    uint32_t trainer = 0);

// CreateSession of `spec` at `target` (rank 0) with `request_id`, as a client makes the call and
// its retry; waits up to 20 s.
absl::StatusOr<v1::CreateSessionResponse> CreateWithRequestId(const std::string& target,
                                                              const v1::SessionSpec& spec,
                                                              const std::string& request_id);

// Waits (up to 10 s) for rank 0's health to turn SERVING.
absl::Status WaitServing(Client& client);

// Every parameter of `params` as fp32 bits, concatenated in id order: equal strings are
// bit-identical parameters.
std::string FlatParams(const HostParameterMap& params);
// Every parameter of `session` pulled, as FlatParams.
absl::StatusOr<std::string> Pulled(Client& client, const std::string& session);
// The merged state dict of `session`: key -> bytes.
absl::StatusOr<std::map<std::string, std::string>> ExportedState(Client& client,
                                                                 const std::string& session);

// Waits (up to 20 s) until the automatic checkpoint of `step` of `session` under checkpoint root
// `root` is complete (its manifest written); DEADLINE_EXCEEDED naming it otherwise.
absl::Status AwaitAutoCheckpoint(const std::string& root, const std::string& session,
                                 uint64_t step);

// A Step stream of a SmallSpec session opened by hand: header and every gradient sent, commit
// not yet. Commit() then sends it and reads the result.
class OpenStep {
 public:
  static absl::StatusOr<std::unique_ptr<OpenStep>> Begin(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& session_id, uint64_t step,
      uint32_t trainer = 0);
  // The header alone, the stream left open (no gradient, no commit).
  static absl::StatusOr<std::unique_ptr<OpenStep>> BeginWithoutGradients(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& session_id, uint64_t step);
  // The header alone; answers the stream's status (e.g. UNAVAILABLE when refused).
  static grpc::Status TryBegin(const std::shared_ptr<grpc::Channel>& channel,
                               const std::string& session_id, uint64_t step);
  // Sends the commit and answers the step number of the result.
  absl::StatusOr<uint64_t> Commit();
  // Half-closes and answers the stream's status.
  grpc::Status Finish();
  // Waits for the server to end the stream (without half-closing it) and answers its status.
  grpc::Status AwaitEnd();

 private:
  std::unique_ptr<v1::OptimizerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream_;
};

// A channel to `target` of a caller that reads nothing it is not asked to: flow-control windows
// of 64 KiB, not grown (no BDP probe), so that an unread stream's writes stay out; messages up to
// 64 MiB.
std::shared_ptr<grpc::Channel> SlowReaderChannel(const std::string& target);

// An export that read its first chunk and reads no more: rank 0 holds its copy of the state
// until it is cancelled. The stub's channel must not read ahead (SlowReaderChannel), and the
// state must take more than one message.
class UnreadExport {
 public:
  UnreadExport(v1::CheckpointService::Stub& stub, const v1::ExportStateDictRequest& request)
      : reader_(stub.ExportStateDict(&context_, request)) {}
  // Whether its first chunk came.
  bool started();
  // Cancels the call; answers how it ended.
  absl::Status Cancel();

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader_;
};

// InitParameters streams held open while they stage: one to each of `sessions`, each sending
// the 1M fp32 elements of parameter 0 (4 MiB) in two messages and no StreamEnd; then, once the
// rank has read what it takes, ended (half-closed). Answers how each ended, in order: a stream
// the rank refused, or INVALID_ARGUMENT (no StreamEnd).
std::vector<grpc::Status> StageAndEndInitStreams(v1::OptimizerService::Stub& stub,
                                                 const std::vector<std::string>& sessions);

// OK when every session counts as many resolutions on every rank of `group` (PeerService.
// ListReplicas): the heal transfers state through resolutions on some ranks only, and a hold
// (checkpoint, state dict) settles every rank at one count.
absl::Status SameResolutionsEverywhere(const std::vector<std::unique_ptr<ServerProcess>>& group);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_TEST_SESSION_H_
