#include "client/cpp/step_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cpp/gradient_wire.h"
#include "wire/grpc_status.h"
#include "wire/proto_dtype.h"

namespace optstep {
namespace client_internal {
namespace {

constexpr char kStepMethod[] = "/optstep.v1.OptimizerService/Step";

grpc::ByteBuffer Serialise(const v1::StepRequest& request) {
  grpc::ByteBuffer buffer;
  bool own = false;
  // Serialising a valid message into a fresh buffer does not fail.
  grpc::SerializationTraits<v1::StepRequest>::Serialize(request, &buffer, &own).IgnoreError();
  return buffer;
}

}  // namespace

StepCall::StepCall(std::shared_ptr<grpc::Channel> channel, absl::Time deadline, bool wait_for_ready)
    : context_(std::make_unique<grpc::ClientContext>()), stub_(std::move(channel)) {
  context_->set_deadline(absl::ToChronoTime(deadline));
  context_->set_wait_for_ready(wait_for_ready);
}

StepCall::~StepCall() {
  if (!started_) return;
  Cancel();
  // What may still hold gradient slices once the call is done: the chunk being written when the
  // stream ended, and the call itself, which the context releases.
  {
    absl::MutexLock lock(&mu_);
    write_.Clear();
  }
  context_.reset();
  absl::MutexLock lock(&pin_mu_);
  pin_mu_.Await(absl::Condition(
      +[](int* pinned) { return *pinned == 0; }, &pinned_));
}

void StepCall::Send(const v1::StepHeader& header, const RankContribution& contribution) {
  Open(header);
  Append(contribution.chunks);
  Commit(contribution.num_elements);
}

void StepCall::Open(const v1::StepHeader& header) {
  stub_.PrepareBidiStreamingCall(context_.get(), kStepMethod, grpc::StubOptions(), this);
  started_ = true;
  v1::StepRequest request;
  *request.mutable_header() = header;
  {
    absl::MutexLock lock(&mu_);
    writing_ = true;
    write_ = Serialise(request);
    StartWrite(&write_);
    StartRead(&read_);
  }
  StartCall();
}

void StepCall::Append(absl::Span<const GradientSlice> chunks) {
  absl::MutexLock lock(&mu_);
  chunks_.insert(chunks_.end(), chunks.begin(), chunks.end());
  WakeWriterLocked();
}

void StepCall::Commit(uint64_t num_elements) {
  absl::MutexLock lock(&mu_);
  num_elements_ = num_elements;
  WakeWriterLocked();
}

void StepCall::WakeWriterLocked() {
  if (writing_) return;
  writing_ = true;
  WriteNextLocked();
}

void StepCall::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  // A failed write means the stream broke: OnDone tells why. The writer stays busy for good.
  if (ok) WriteNextLocked();
}

void StepCall::WriteNextLocked() {
  if (next_chunk_ < chunks_.size()) {
    {
      // Counted before the slice exists: gRPC may release it on another thread at any time.
      absl::MutexLock lock(&pin_mu_);
      ++pinned_;
    }
    write_ = GradientChunkMessage(chunks_[next_chunk_++], &StepCall::Unpin, this);
    StartWrite(&write_);
  } else if (!num_elements_.has_value()) {
    writing_ = false;  // idle until Append or Commit
  } else if (!committed_) {
    committed_ = true;
    v1::StepRequest request;
    request.mutable_commit()->set_num_elements(*num_elements_);
    write_ = Serialise(request);
    StartWrite(&write_);
  } else {
    StartWritesDone();
  }
}

void StepCall::Unpin(void* call) {
  auto* self = static_cast<StepCall*>(call);
  absl::MutexLock lock(&self->pin_mu_);
  --self->pinned_;
}

void StepCall::OnReadDone(bool ok) {
  absl::MutexLock lock(&mu_);
  if (!ok) return;  // no more responses; OnDone follows
  responses_.push_back(std::make_unique<grpc::ByteBuffer>(std::move(read_)));
  read_.Clear();
  StartRead(&read_);
}

void StepCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  final_status_ = FromGrpcStatus(status);
  done_ = true;
}

bool StepCall::AwaitAnswer(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](StepCall* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                    return self->done_ || !self->responses_.empty();
                                  },
                                  this),
                              wait);
}

absl::Status StepCall::EndedWith() {
  absl::MutexLock lock(&mu_);
  return done_ ? final_status_ : absl::OkStatus();
}

std::unique_ptr<grpc::ByteBuffer> StepCall::NextResponse() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StepCall* self)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->done_ || !self->responses_.empty(); },
      this));
  if (responses_.empty()) return nullptr;
  std::unique_ptr<grpc::ByteBuffer> next = std::move(responses_.front());
  responses_.pop_front();
  return next;
}

absl::Status StepCall::Receive(v1::StepResult* result, ParamAssembler* assembler) {
  v1::StepResponse response;
  // Parses the next response; false once the call ended.
  auto read = [&]() -> absl::StatusOr<bool> {
    std::unique_ptr<grpc::ByteBuffer> next = NextResponse();
    if (next == nullptr) return false;
    if (!grpc::SerializationTraits<v1::StepResponse>::Deserialize(next.get(), &response).ok()) {
      return absl::InternalError("Step stream sent a message that is not a StepResponse");
    }
    return true;
  };
  auto broken = [&](absl::Status status) {
    Cancel();
    return status;
  };
  absl::StatusOr<bool> more = read();
  if (!more.ok()) return broken(more.status());
  if (!*more) {
    OPTSTEP_RETURN_IF_ERROR(Finish());
    return absl::InternalError("Step stream ended OK without a StepResult");
  }
  if (!response.has_result()) {
    return broken(
        absl::InternalError("Step stream began with a parameter chunk, not a StepResult"));
  }
  *result = response.result();
  uint64_t chunks = 0;
  while (true) {
    more = read();
    if (!more.ok()) return broken(more.status());
    if (!*more) break;
    if (!response.has_parameter()) {
      return broken(absl::InternalError("Step stream sent a second StepResult"));
    }
    ++chunks;
    if (assembler == nullptr) {
      return broken(absl::InternalError("Step stream sent parameters that were not asked for"));
    }
    const v1::TensorChunk& chunk = response.parameter();
    absl::StatusOr<DType> dtype = DTypeFromProto(
        chunk.dtype(), absl::StrCat("Step stream: parameter chunk of param_id ", chunk.param_id()));
    absl::Status added =
        dtype.ok() ? assembler->Add(chunk.param_id(), chunk.offset(), *dtype, chunk.data())
                   : absl::InternalError(dtype.status().message());
    if (!added.ok()) return broken(added);
  }
  OPTSTEP_RETURN_IF_ERROR(Finish());
  if (chunks != result->params_to_follow()) {
    return absl::InternalError(absl::StrCat("Step stream announced ", result->params_to_follow(),
                                            " parameter chunks and sent ", chunks));
  }
  return absl::OkStatus();
}

void StepCall::Cancel() {
  if (!started_) return;
  context_->TryCancel();
  Finish().IgnoreError();
}

absl::Status StepCall::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return final_status_;
}

}  // namespace client_internal
}  // namespace optstep
