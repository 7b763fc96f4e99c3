#ifndef OPTSTEP_TESTS_TESTING_FAKE_OPTIMIZER_SERVICE_H_
#define OPTSTEP_TESTS_TESTING_FAKE_OPTIMIZER_SERVICE_H_

// An in-process stand-in for one optstep rank, for client tests: it serves one session (a
// SessionInfo given by the test), records every request it receives and answers Step and
// PullParameters with deterministic parameter values, FakeValue(param_id, element), in chunks of
// `reply_chunk_elements`. No optimizer math. Thread-safe (gRPC calls handlers concurrently).

#include <grpcpp/server.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"

namespace optstep {
namespace testutil {

// The value the fake holds for element `i` of parameter `p`.
inline float FakeValue(uint32_t p, uint64_t i) {
  return static_cast<float>(p) * 100.0f + static_cast<float>(i) * 0.5f;
}

class FakeOptimizerService final : public v1::OptimizerService::Service {
 public:
  struct Behaviour {
    uint64_t reply_chunk_elements = 3;
    // Step: end the stream with this status after reading every request (when not OK), or
    // right after the header with `error_at_header` (a rank that refuses the step, or dies, while
    // the trainer still sends).
    grpc::Status step_error = grpc::Status::OK;
    bool error_at_header = false;
    bool skipped = false;               // StepResult.skipped, and no parameters follow
    bool miscount_chunks = false;       // announce one chunk more than is sent
    bool leave_out_last_chunk = false;  // leave a hole in the last parameter
    // Step returns these parameters (as their owner does under OWNERS storage) instead of those
    // the header asks for; empty: as asked.
    std::vector<uint32_t> step_returns;
    // Set: Step waits after its first parameter chunk until this is notified, at most 5 s
    // (resume_timed_out() tells whether it was not).
    absl::Notification* resume = nullptr;
    // CloseSession answers this status when not OK, after closing the session when
    // `close_then_error` (a rank whose answer was lost after it closed it).
    grpc::Status close_error = grpc::Status::OK;
    bool close_then_error = false;
    // CreateSession answers this status when not OK, after taking the request (a rank whose
    // answer was lost).
    grpc::Status create_error = grpc::Status::OK;
    // GetSession answers this status when not OK (CANCELLED: a server that stops).
    grpc::Status get_error = grpc::Status::OK;
    // InitParameters answers UNAVAILABLE this many times first, after reading every request
    // (a group that heals).
    int init_unavailable = 0;
    // ListSessions tells where each rank is served and which are stood in for (as a rank does
    // while a stand-in runs); empty: nothing.
    std::vector<std::string> rank_targets;
    std::vector<uint32_t> stood_in_ranks;
  };

  explicit FakeOptimizerService(v1::SessionInfo session);

  void set_behaviour(const Behaviour& behaviour) ABSL_LOCKS_EXCLUDED(mu_);

  // Everything received so far, in order.
  std::vector<v1::StepRequest> step_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<v1::InitParametersRequest> init_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> closed_sessions() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<v1::CreateSessionRequest> create_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  int step_streams() const ABSL_LOCKS_EXCLUDED(mu_);
  bool resume_timed_out() const ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status CreateSession(grpc::ServerContext* context, const v1::CreateSessionRequest* request,
                             v1::CreateSessionResponse* response) override;
  grpc::Status GetSession(grpc::ServerContext* context, const v1::GetSessionRequest* request,
                          v1::SessionInfo* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context, const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status CloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse* response) override;
  grpc::Status InitParameters(grpc::ServerContext* context,
                              grpc::ServerReader<v1::InitParametersRequest>* reader,
                              v1::InitParametersResponse* response) override;
  grpc::Status Step(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<v1::StepResponse, v1::StepRequest>* stream) override;
  grpc::Status PullParameters(grpc::ServerContext* context,
                              const v1::PullParametersRequest* request,
                              grpc::ServerWriter<v1::PullParametersResponse>* writer) override;

 private:
  // The chunks of the parameters `ids` (all when empty) in `dtype`, last parameter first.
  std::vector<v1::TensorChunk> ParameterChunks(const std::vector<uint32_t>& ids, v1::DType dtype,
                                               const Behaviour& behaviour) const;
  grpc::Status CheckSession(const std::string& id) const;

  const v1::SessionInfo session_;
  mutable absl::Mutex mu_;
  Behaviour behaviour_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepRequest> step_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::InitParametersRequest> init_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::CreateSessionRequest> create_requests_ ABSL_GUARDED_BY(mu_);
  int step_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool resume_timed_out_ ABSL_GUARDED_BY(mu_) = false;
};

// A gRPC server on localhost:0 with `service` and gRPC's default health service.
struct FakeServer {
  std::unique_ptr<grpc::Server> server;
  std::string target;  // "localhost:<port>"
};
FakeServer StartFakeServer(grpc::Service* service);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_FAKE_OPTIMIZER_SERVICE_H_
