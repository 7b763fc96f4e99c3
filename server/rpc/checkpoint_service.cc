#include "server/rpc/checkpoint_service.h"

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc/convert.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/status_bridge.h"

namespace optstep {
namespace {

v1::DType WireType(StateTensor::Type type) {
  return type == StateTensor::Type::kI64 ? v1::DTYPE_INT64 : v1::DTYPE_FP32;
}

// Streams each tensor of the state dict in chunks of at most kMaxChunkBytes.
class ExportReactor final : public OwnedWriteReactor<v1::StateDictChunk, ExportReactor> {
 public:
  void Start(std::shared_ptr<ExportReactor> self, Engine* engine,
             const v1::ExportStateDictRequest& request) {
    Own(std::move(self));
    auto session = engine->GetSession(request.session_id());
    if (!session.ok()) {
      absl::MutexLock lock(&mu_);
      return FinishLocked(ToGrpcStatus(session.status()));
    }
    std::weak_ptr<ExportReactor> weak = weak_from_this();
    (*session)->ExportState(
        {request.model_chunks().begin(), request.model_chunks().end()},
        [weak](absl::StatusOr<std::shared_ptr<const StateDict>> dict) {
          if (auto self = weak.lock()) self->OnState(std::move(dict));
        });
  }

 private:
  void OnState(absl::StatusOr<std::shared_ptr<const StateDict>> dict) {
    absl::MutexLock lock(&mu_);
    if (!dict.ok()) return FinishLocked(ToGrpcStatus(dict.status()));
    dict_ = *std::move(dict);
    next_ = dict_->begin();
    WriteNextLocked();
  }

  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (next_ == dict_->end()) return FinishLocked(grpc::Status::OK);
    const auto& [key, tensor] = *next_;
    const size_t element = tensor.type == StateTensor::Type::kI64 ? 8 : 4;
    const size_t n = std::min(kMaxChunkBytes / element * element, tensor.bytes.size() - offset_);
    chunk_.Clear();
    chunk_.set_key(key);
    for (int64_t d : tensor.shape) chunk_.add_shape(d);
    chunk_.set_offset(offset_ / element);
    chunk_.set_dtype(WireType(tensor.type));
    chunk_.set_data(tensor.bytes.data() + offset_, n);
    offset_ += n;
    if (offset_ >= tensor.bytes.size()) {
      ++next_;
      offset_ = 0;
    }
    StartWrite(&chunk_);
  }

  std::shared_ptr<const StateDict> dict_ ABSL_GUARDED_BY(mu_);
  StateDict::const_iterator next_ ABSL_GUARDED_BY(mu_);
  size_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  v1::StateDictChunk chunk_ ABSL_GUARDED_BY(mu_);
};

// Collects the streamed tensors, then hands the whole dict to the session.
class ImportReactor final : public grpc::ServerReadReactor<v1::StateDictChunk> {
 public:
  ImportReactor(Engine* engine, v1::ImportStateDictResponse* response)
      : engine_(engine), response_(response), dict_(std::make_shared<StateDict>()) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Apply();
    absl::Status status = Add();
    if (!status.ok()) return Finish(ToGrpcStatus(status));
    StartRead(&chunk_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Add() {
    if (session_ == nullptr) {
      auto session = engine_->GetSession(chunk_.session_id());
      if (!session.ok()) return session.status();
      session_ = *std::move(session);
    }
    const std::string what = absl::StrCat("state dict key '", chunk_.key(), "'");
    if (chunk_.data().size() > kMaxChunkBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": chunk of ", chunk_.data().size(),
                                                       " bytes exceeds ", kMaxChunkBytes));
    }
    StateTensor::Type type;
    if (chunk_.dtype() == v1::DTYPE_FP32) {
      type = StateTensor::Type::kF32;
    } else if (chunk_.dtype() == v1::DTYPE_INT64) {
      type = StateTensor::Type::kI64;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ",
                                                     static_cast<int>(chunk_.dtype()),
                                                     " is not fp32 or int64"));
    }
    Shape shape(chunk_.shape().begin(), chunk_.shape().end());
    for (int64_t d : shape) {
      if (d < 1 || d > (int64_t{1} << 40)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": dimension ", d, " out of range"));
      }
    }
    const size_t element = type == StateTensor::Type::kI64 ? 8 : 4;
    const size_t total = static_cast<size_t>(NumElements(shape)) * element;
    auto [it, fresh] = dict_->try_emplace(chunk_.key());
    StateTensor& tensor = it->second;
    if (fresh) {
      tensor.type = type;
      tensor.shape = shape;
      tensor.bytes.assign(total, '\0');
    } else if (tensor.type != type || tensor.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": chunks disagree on dtype or shape"));
    }
    const size_t begin = chunk_.offset() * element;
    if (chunk_.data().size() % element != 0 || begin > total ||
        chunk_.data().size() > total - begin) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": chunk at element ", chunk_.offset(),
                                                     " of ", chunk_.data().size(),
                                                     " bytes exceeds ", total, " bytes"));
    }
    tensor.bytes.replace(begin, chunk_.data().size(), chunk_.data());
    response_->set_bytes(response_->bytes() + chunk_.data().size());
    return absl::OkStatus();
  }

  void Apply() {
    if (session_ == nullptr) {
      return Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty state dict stream"));
    }
    response_->set_tensors(dict_->size());
    session_->ImportState(dict_, [this](absl::Status status) { Finish(ToGrpcStatus(status)); });
  }

  Engine* const engine_;
  v1::ImportStateDictResponse* const response_;
  std::shared_ptr<StateDict> dict_;
  std::shared_ptr<Session> session_;
  v1::StateDictChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<v1::StateDictChunk>* CheckpointServiceImpl::ExportStateDict(
    grpc::CallbackServerContext*, const v1::ExportStateDictRequest* request) {
  auto reactor = std::make_shared<ExportReactor>();
  ExportReactor* raw = reactor.get();
  raw->Start(std::move(reactor), engine_, *request);
  return raw;
}

grpc::ServerReadReactor<v1::StateDictChunk>* CheckpointServiceImpl::ImportStateDict(
    grpc::CallbackServerContext*, v1::ImportStateDictResponse* response) {
  return new ImportReactor(engine_, response);
}

}  // namespace optstep
