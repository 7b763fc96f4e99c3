#include "server/rpc/optimizer_service.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "server/rpc/caller.h"
#include "server/rpc/caller_calls.h"
#include "server/rpc/param_stream_reactors.h"
#include "server/rpc/session_pages.h"
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
  const std::string owner = CallerOf(*context).identity;
  // The request is held while the call waits its turn: its bytes count in the caller's queue.
  const auto request_bytes = static_cast<int64_t>(request->ByteSizeLong());
  absl::Status queued = ProcessCallerCalls().Run(
      owner, "CreateSession",
      [this, owner, context, request, response, reactor] {
        // Cancelled while it waited (the caller gave up): nothing is made for nobody.
        if (context->IsCancelled()) {
          reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                       "CreateSession: cancelled while it waited its turn"));
          return;
        }
        auto created = group_->CreateSession(request->spec(), owner, request->request_id());
        absl::Status status = created.status();
        if (status.ok()) {
          const std::string& id = created->session->id();
          SessionSummaryToProto(*created->session, Directory(), response->mutable_summary());
          response->set_attached(created->attached);
          status = CheckAnswerSize(*response, max_answer_bytes_,
                                   absl::StrCat("the CreateSession answer of session '", id, "'"));
          // Creation is atomic with its answer: a session the caller cannot learn of is not kept.
          if (!status.ok() && created->made) {
            const absl::Status closed = group_->CloseSession(id);
            if (!closed.ok()) LOG(WARNING) << "closing session '" << id << "': " << closed;
          }
        }
        reactor->Finish(ToGrpcStatus(status));
      },
      request_bytes);
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued));
  return reactor;
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                           const v1::GetSessionRequest* request,
                                                           v1::SessionInfo* response) {
  auto session = FindSession(*engine_, CallerOf(*context), request->session_id());
  if (!session.ok()) return Done(context, session.status());
  absl::Status status = SessionPageToProto(**session, Directory(), request->layout_offset(),
                                           request->layout_limit(), max_answer_bytes_, response);
  if (status.ok()) {
    status =
        CheckAnswerSize(*response, max_answer_bytes_,
                        absl::StrCat("the GetSession answer of session '", request->session_id(),
                                     "' at layout_offset ", request->layout_offset()));
  }
  return Done(context, status);
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                             const v1::ListSessionsRequest* request,
                                                             v1::ListSessionsResponse* response) {
  SessionsPageToProto(engine_->ListSessions(), CallerOf(*context), *request, Directory(), response);
  return Done(context, CheckAnswerSize(*response, max_answer_bytes_, "the ListSessions page"));
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::CloseSession(grpc::CallbackServerContext* context,
                                                             const v1::CloseSessionRequest* request,
                                                             v1::CloseSessionResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const Caller caller = CallerOf(*context);
  absl::Status queued = ProcessCallerCalls().Run(
      caller.identity, "CloseSession",
      [this, caller, context, request, reactor] {
        // Cancelled while it waited its turn: the caller was told nothing was done.
        if (context->IsCancelled()) {
          reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                                       "CloseSession: cancelled while it waited its turn"));
          return;
        }
        // Before FindSession: a forming rank 0 holds none or some of the group's sessions, and a
        // NOT_FOUND reads as closed to a client that tried once before.
        absl::Status status = group_->FormingStatus(
            absl::StrCat("close session '", request->session_id(), "' again"));
        if (status.ok()) status = FindSession(*engine_, caller, request->session_id()).status();
        if (status.ok()) status = group_->CloseSession(request->session_id());
        reactor->Finish(ToGrpcStatus(status));
      },
      static_cast<int64_t>(request->SpaceUsedLong()));
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued));
  return reactor;
}

grpc::ServerReadReactor<v1::InitParametersRequest>* OptimizerServiceImpl::InitParameters(
    grpc::CallbackServerContext* context, v1::InitParametersResponse* response) {
  return StartInitReactor(context, step_limits_.idle_timeout, engine_, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* OptimizerServiceImpl::Step(
    grpc::CallbackServerContext* context) {
  // A group that lost a rank cannot complete a step: every stream is refused, naming the rank.
  absl::Status lost = group_->LostPeersStatus();
  if (!lost.ok()) return new RefusedStepReactor(lost);
  return StartStepReactor(
      context, engine_, CallerOf(*context), step_limits_, [this] { return NewStepsStatus(); },
      streams_);
}

RankDirectory OptimizerServiceImpl::Directory() const {
  return RankDirectory{group_->addresses(), group_->stood_in_ranks()};
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
  return StartPullReactor(context, step_limits_.idle_timeout, engine_, request);
}

grpc::ServerUnaryReactor* OptimizerServiceImpl::AttachSharedMemory(
    grpc::CallbackServerContext* context, const v1::AttachSharedMemoryRequest* request,
    v1::AttachSharedMemoryResponse* response) {
  auto session = FindSession(*engine_, CallerOf(*context), request->session_id());
  if (!session.ok()) return Done(context, session.status());
  if (request->release()) {
    engine_->ReleaseSharedMemory(**session, static_cast<int>(request->trainer_id()));
    return Done(context, absl::OkStatus());
  }
  auto segment = engine_->AttachSharedMemory(**session, static_cast<int>(request->trainer_id()));
  if (!segment.ok()) return Done(context, segment.status());
  const SharedSegment& s = **segment;
  response->set_segment_id(s.id);
  response->set_path(s.memory->path());
  response->set_token(s.token);
  response->set_bytes(s.memory->size());
  response->set_gradients_offset(s.gradients_offset);
  response->set_parameters_offset(s.parameters_offset);
  return Done(context, absl::OkStatus());
}

}  // namespace optstep
