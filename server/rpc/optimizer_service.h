#ifndef OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_
#define OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// The trainer-facing service (callback API). Each handler converts and validates the request
// (server/rpc/convert), calls the engine and converts back; no math here. Thread-safe.
class OptimizerServiceImpl final : public v1::OptimizerService::CallbackService {
 public:
  // `engine` and `group` must outlive the service.
  OptimizerServiceImpl(Engine* engine, RankGroup* group) : engine_(engine), group_(group) {}

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
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Step(
      grpc::CallbackServerContext* context) override;
  grpc::ServerWriteReactor<v1::PullParametersResponse>* PullParameters(
      grpc::CallbackServerContext* context, const v1::PullParametersRequest* request) override;

 private:
  // Fills the layout's rank addresses.
  void AddRankTargets(v1::SessionInfo* info) const;

  Engine* const engine_;
  RankGroup* const group_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OPTIMIZER_SERVICE_H_
