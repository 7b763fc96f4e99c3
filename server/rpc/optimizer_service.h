#ifndef OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_
#define OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/live_step_streams.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/session_pages.h"
#include "server/rpc/step_reactor.h"

namespace optstep {

// The generated callback service with Step raw (ByteBuffer in and out; step_reactor.h).
using OptimizerServiceBase = v1::OptimizerService::WithCallbackMethod_CreateSession<
    v1::OptimizerService::WithCallbackMethod_GetSession<
        v1::OptimizerService::WithCallbackMethod_ListSessions<
            v1::OptimizerService::WithCallbackMethod_CloseSession<
                v1::OptimizerService::WithCallbackMethod_InitParameters<
                    v1::OptimizerService::WithRawCallbackMethod_Step<
                        v1::OptimizerService::WithCallbackMethod_PullParameters<
                            v1::OptimizerService::WithCallbackMethod_AttachSharedMemory<
                                v1::OptimizerService::Service>>>>>>>>;

// The trainer-facing service (callback API). Each handler converts and validates the request
// (server/rpc/convert), calls the engine and converts back; no math here. Thread-safe.
class OptimizerServiceImpl final : public OptimizerServiceBase {
 public:
  // `engine`, `group` and `streams` must outlive the service; `step_limits` bound each Step
  // stream, which is in `streams` while it is open; no unary answer is larger than
  // `max_answer_bytes` (the server's message size).
  OptimizerServiceImpl(Engine* engine, RankGroup* group, const StepStreamLimits& step_limits,
                       size_t max_answer_bytes, LiveStepStreams* streams)
      : engine_(engine),
        group_(group),
        step_limits_(step_limits),
        max_answer_bytes_(max_answer_bytes),
        streams_(streams) {}

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::CreateSessionResponse* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;
  grpc::ServerReadReactor<v1::InitParametersRequest>* InitParameters(
      grpc::CallbackServerContext* context, v1::InitParametersResponse* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<v1::PullParametersResponse>* PullParameters(
      grpc::CallbackServerContext* context, const v1::PullParametersRequest* request) override;
  grpc::ServerUnaryReactor* AttachSharedMemory(grpc::CallbackServerContext* context,
                                               const v1::AttachSharedMemoryRequest* request,
                                               v1::AttachSharedMemoryResponse* response) override;

 private:
  // Why a step that has not begun is refused: this rank shuts down, or a peer left or is lost.
  absl::Status NewStepsStatus() const;
  // Where trainers reach each rank now, as the group knows it.
  RankDirectory Directory() const;

  Engine* const engine_;
  RankGroup* const group_;
  const StepStreamLimits step_limits_;
  const size_t max_answer_bytes_;
  LiveStepStreams* const streams_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_
