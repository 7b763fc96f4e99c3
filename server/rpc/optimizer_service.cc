#include "server/rpc/optimizer_service.h"

#include "server/rpc/convert.h"
#include "server/rpc/parameter_reactors.h"
#include "server/rpc/status_bridge.h"
#include "server/rpc/step_reactor.h"

namespace optstep {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* OptimizerServiceImpl::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::CreateSessionResponse* response) {
  auto config = SessionConfigFromProto(request->spec());
  if (!config.ok()) return Done(context, config.status());
  auto created = engine_->CreateSession(*std::move(config));
  if (!created.ok()) return Done(context, created.status());
  SessionToProto(*created->session, response->mutable_session());
  response->set_attached(created->attached);
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                           const v1::GetSessionRequest* request,
                                                           v1::SessionInfo* response) {
  auto session = engine_->GetSession(request->session_id());
  if (!session.ok()) return Done(context, session.status());
  SessionToProto(**session, response);
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                             const v1::ListSessionsRequest*,
                                                             v1::ListSessionsResponse* response) {
  for (const auto& session : engine_->ListSessions()) {
    SessionToProto(*session, response->add_sessions());
  }
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                             const v1::CloseSessionRequest* request,
                                                             v1::CloseSessionResponse*) {
  return Done(context, engine_->CloseSession(request->session_id()));
}

grpc::ServerReadReactor<v1::InitParametersRequest>* OptimizerServiceImpl::InitParameters(
    grpc::CallbackServerContext*, v1::InitParametersResponse* response) {
  return StartInitReactor(engine_, response);
}

grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* OptimizerServiceImpl::Step(
    grpc::CallbackServerContext*) {
  return StartStepReactor(engine_);
}

grpc::ServerWriteReactor<v1::PullParametersResponse>* OptimizerServiceImpl::PullParameters(
    grpc::CallbackServerContext*, const v1::PullParametersRequest* request) {
  return StartPullReactor(engine_, request);
}

}  // namespace optstep
