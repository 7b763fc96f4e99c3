#include "server/rpc/optimizer_service.h"

#include "base/run_detached.h"
#include "server/rpc/caller.h"
#include "server/rpc/convert.h"
#include "server/rpc/param_stream_reactors.h"
#include "server/rpc/step_reactor.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A Step stream refused before it reads anything: finished at once with `status`. Owns itself.
class RefusedStepReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit RefusedStepReactor(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* OptimizerServiceImpl::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::CreateSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Allocating the state and connecting the ranks' group take a while: not on the reaction.
  RunDetached([this, owner = CallerOf(*context).identity, request, response, reactor] {
    auto created = group_->CreateSession(request->spec(), owner);
    if (created.ok()) {
      SessionToProto(*created->session, response->mutable_session());
      AddRankTargets(response->mutable_session());
      response->set_attached(created->attached);
    }
    reactor->Finish(ToGrpcStatus(created.status()));
  });
  return reactor;
}

void OptimizerServiceImpl::AddRankTargets(v1::SessionInfo* info) const {
  for (const std::string& address : group_->addresses()) {
    info->mutable_layout()->add_rank_targets(address);
  }
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                           const v1::GetSessionRequest* request,
                                                           v1::SessionInfo* response) {
  auto session = FindSession(*engine_, CallerOf(*context), request->session_id());
  if (!session.ok()) return Done(context, session.status());
  SessionToProto(**session, response);
  AddRankTargets(response);
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                             const v1::ListSessionsRequest*,
                                                             v1::ListSessionsResponse* response) {
  const Caller caller = CallerOf(*context);
  for (const auto& session : engine_->ListSessions()) {
    if (!MaySee(caller, *session)) continue;
    v1::SessionInfo* info = response->add_sessions();
    SessionToProto(*session, info);
    AddRankTargets(info);
  }
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                             const v1::CloseSessionRequest* request,
                                                             v1::CloseSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunDetached([this, caller = CallerOf(*context), request, reactor] {
    absl::Status status = FindSession(*engine_, caller, request->session_id()).status();
    if (status.ok()) status = group_->CloseSession(request->session_id());
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerReadReactor<v1::InitParametersRequest>* OptimizerServiceImpl::InitParameters(
    grpc::CallbackServerContext* context, v1::InitParametersResponse* response) {
  return StartInitReactor(engine_, CallerOf(*context), response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OptimizerServiceImpl::Step(
    grpc::CallbackServerContext* context) {
  // A group that lost a rank cannot complete a step: every stream is refused, naming the rank.
  absl::Status lost = group_->LostPeersStatus();
  if (!lost.ok()) return new RefusedStepReactor(lost);
  return StartStepReactor(engine_, CallerOf(*context), step_limits_,
                          [this] { return NewStepsStatus(); });
}

absl::Status OptimizerServiceImpl::NewStepsStatus() const {
  if (!engine_->accepting_steps()) {
    return absl::UnavailableError("this rank is shutting down and takes no new steps");
  }
  // A peer that left drains its running steps as this rank would: the same steps complete.
  return group_->PeersStatus();
}

grpc::ServerWriteReactor<v1::PullParametersResponse>* OptimizerServiceImpl::PullParameters(
    grpc::CallbackServerContext* context, const v1::PullParametersRequest* request) {
  return StartPullReactor(engine_, CallerOf(*context), request);
}

}  // namespace optstep
