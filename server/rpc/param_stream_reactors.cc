#include "server/rpc/param_stream_reactors.h"

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/param_chunker.h"
#include "wire/chunk.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

class PullReactor final : public OwnedWriteReactor<v1::PullParametersResponse, PullReactor> {
 public:
  void Start(std::shared_ptr<PullReactor> self, Engine* engine, const Caller& caller,
             const v1::PullParametersRequest& request) {
    Own(std::move(self));
    absl::Status status = Validate(engine, caller, request);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      return FinishLocked(ToGrpcStatus(status));
    }
    std::weak_ptr<PullReactor> weak = weak_from_this();
    session_->GetSnapshot(dtype_, [weak](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) {
      if (auto self = weak.lock()) self->OnSnapshot(std::move(s));
    });
  }

 private:
  absl::Status Validate(Engine* engine, const Caller& caller,
                        const v1::PullParametersRequest& request) {
    auto session = FindSession(*engine, caller, request.session_id());
    if (!session.ok()) return session.status();
    session_ = *std::move(session);
    if (request.dtype() == v1::DTYPE_BF16) {
      dtype_ = DType::kBF16;
    } else if (request.dtype() != v1::DTYPE_FP32 && request.dtype() != v1::DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PullParameters: dtype ", static_cast<int>(request.dtype()), " must be fp32 or bf16"));
    }
    OPTSTEP_RETURN_IF_ERROR(CheckParamIds(*session_, request.param_ids(), "PullParameters"));
    ids_.assign(request.param_ids().begin(), request.param_ids().end());
    return absl::OkStatus();
  }

  void OnSnapshot(absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot) {
    absl::MutexLock lock(&mu_);
    if (!snapshot.ok()) return FinishLocked(ToGrpcStatus(snapshot.status()));
    step_ = (*snapshot)->step;
    chunker_.emplace(*std::move(snapshot), ids_, kMaxChunkBytes);
    WriteNextLocked();
  }

  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    response_.Clear();
    if (first_) response_.set_step(step_);
    first_ = false;
    if (chunker_->Next(response_.mutable_parameter())) return StartWrite(&response_);
    FinishLocked(grpc::Status::OK);
  }

  std::shared_ptr<Session> session_;
  DType dtype_ = DType::kF32;
  std::vector<uint32_t> ids_;

  std::optional<ParamChunker> chunker_ ABSL_GUARDED_BY(mu_);
  v1::PullParametersResponse response_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
};

class InitReactor final : public grpc::ServerReadReactor<v1::InitParametersRequest> {
 public:
  InitReactor(Engine* engine, Caller caller, v1::InitParametersResponse* response)
      : engine_(engine), caller_(std::move(caller)), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // half-close: done
    absl::Status status = Apply();
    if (!status.ok()) return Finish(ToGrpcStatus(status));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Apply() {
    if (session_ == nullptr) {
      auto session = FindSession(*engine_, caller_, request_.session_id());
      if (!session.ok()) return session.status();
      session_ = *std::move(session);
    } else if (!request_.session_id().empty() && request_.session_id() != session_->id()) {
      return absl::InvalidArgumentError(
          absl::StrCat("InitParameters: session_id '", request_.session_id(),
                       "' differs from the stream's session '", session_->id(), "'"));
    }
    if (!request_.has_values()) return absl::OkStatus();
    const v1::TensorChunk& chunk = request_.values();
    OPTSTEP_ASSIGN_OR_RETURN(
        const ChunkHeader header,
        CheckChunkHeader(chunk.param_id(), chunk.offset(), chunk.dtype(), chunk.data().size(),
                         absl::StrCat("InitParameters: values of param_id ", chunk.param_id())));
    absl::Status status = session_->InitValues(header.param_id, header.offset, header.dtype,
                                               chunk.data().data(), chunk.data().size());
    if (status.ok()) {
      response_->set_elements(response_->elements() +
                              chunk.data().size() / DTypeSize(header.dtype));
    }
    return status;
  }

  Engine* const engine_;
  const Caller caller_;
  v1::InitParametersResponse* const response_;
  v1::InitParametersRequest request_;
  std::shared_ptr<Session> session_;
};

}  // namespace

grpc::ServerWriteReactor<v1::PullParametersResponse>* StartPullReactor(
    Engine* engine, const Caller& caller, const v1::PullParametersRequest* request) {
  auto reactor = std::make_shared<PullReactor>();
  PullReactor* raw = reactor.get();
  raw->Start(std::move(reactor), engine, caller, *request);
  return raw;
}

grpc::ServerReadReactor<v1::InitParametersRequest>* StartInitReactor(
    Engine* engine, Caller caller, v1::InitParametersResponse* response) {
  return new InitReactor(engine, std::move(caller), response);
}

}  // namespace optstep
