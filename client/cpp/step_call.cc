#include "client/cpp/step_call.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cpp/gradient_wire.h"
#include "wire/grpc_status.h"
#include "wire/proto_dtype.h"
#include "wire/raw_step_codec.h"

namespace optstep {
namespace client_internal {
namespace {

constexpr char kStepMethod[] = "/optstep.v1.OptimizerService/Step";

// Responses taken from gRPC and not yet read; the stream's flow-control window
// (ClientOptions::stream_lookahead_bytes) bounds what waits in the transport beyond them.
constexpr size_t kReadAhead = 2;

grpc::ByteBuffer Serialise(const v1::StepRequest& request) {
  grpc::ByteBuffer buffer;
  bool own = false;
  // Serialising a valid message into a fresh buffer does not fail.
  grpc::SerializationTraits<v1::StepRequest>::Serialize(request, &buffer, &own).IgnoreError();
  return buffer;
}

}  // namespace

uint64_t Arrivals::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

void Arrivals::Add() {
  absl::MutexLock lock(&mu_);
  ++count_;
}

void Arrivals::AwaitAfter(uint64_t seen) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ != seen; };
  mu_.Await(absl::Condition(&changed));
}

StepCall::StepCall(std::shared_ptr<grpc::Channel> channel, absl::Time deadline, bool wait_for_ready,
                   std::shared_ptr<Arrivals> arrivals)
    : context_(std::make_unique<grpc::ClientContext>()),
      stub_(std::move(channel)),
      arrivals_(std::move(arrivals)) {
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
    // Append and Commit start writes from the caller's thread, outside any reaction: gRPC must
    // not end the call (OnDone) while one may still come, or the write would run on a call that
    // is gone. Held until the writer can start none (EndWriterHoldLocked).
    writer_hold_ = true;
  }
  AddHold();
  StartCall();
}

void StepCall::Append(absl::Span<const GradientSlice> chunks) {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    chunks_.insert(chunks_.end(), chunks.begin(), chunks.end());
    WakeWriterLocked();
    release = EndWriterHoldLocked();
  }
  if (release) RemoveHold();  // without mu_: it may end the call, and OnDone takes mu_
}

void StepCall::Commit(uint64_t num_elements) {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    num_elements_ = num_elements;
    WakeWriterLocked();
    release = EndWriterHoldLocked();
  }
  if (release) RemoveHold();
}

bool StepCall::EndWriterHoldLocked() {
  // The writer starts nothing more once the half-close is out, a write failed (the writer stays
  // busy for good) or the call was cancelled.
  if (!writer_hold_ || !(writes_done_ || write_failed_ || cancelled_)) return false;
  writer_hold_ = false;
  return true;
}

void StepCall::WakeWriterLocked() {
  if (writing_ || cancelled_) return;  // after a cancel the writer's hold may be gone
  writing_ = true;
  WriteNextLocked();
}

void StepCall::OnWriteDone(bool ok) {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    // A failed write means the stream broke: OnDone tells why. The writer stays busy for good.
    if (ok) {
      WriteNextLocked();
    } else {
      write_failed_ = true;
    }
    release = EndWriterHoldLocked();
  }
  if (release) RemoveHold();
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
    writes_done_ = true;
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
  if (responses_.size() < kReadAhead || cancelled_) {
    StartRead(&read_);
  } else {
    // The reader is behind: the next read starts once it takes a response, so that the rank
    // waits on the stream's flow control instead of filling this process. The hold keeps the
    // call alive for that read, which starts outside a reaction.
    paused_ = true;
    AddHold();
  }
  if (arrivals_ != nullptr) arrivals_->Add();
}

bool StepCall::ResumeReadingLocked() {
  if (!paused_) return false;
  paused_ = false;
  StartRead(&read_);
  return true;
}

void StepCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  final_status_ = FromGrpcStatus(status);
  if (absl::IsCancelled(final_status_) && !cancel_requested_) {
    // The server cancelled the stream: its process stopped (a stand-in giving way to its rank's
    // own process, a shutdown). The group's recovery redoes the step, as after a lost rank.
    final_status_ = absl::UnavailableError(
        absl::StrCat("the server cancelled the Step stream (", final_status_.message(),
                     "): it stopped; the step is redone once the group serves"));
  }
  done_ = true;
  // Under mu_: once done_ is seen, the owner may destroy this call.
  if (arrivals_ != nullptr) arrivals_->Add();
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

std::unique_ptr<grpc::ByteBuffer> StepCall::TakeResponse(bool* ended) {
  std::unique_ptr<grpc::ByteBuffer> next;
  bool resumed = false;
  {
    absl::MutexLock lock(&mu_);
    *ended = done_ && responses_.empty();
    if (responses_.empty()) return nullptr;
    next = std::move(responses_.front());
    responses_.pop_front();
    resumed = ResumeReadingLocked();
  }
  if (resumed) RemoveHold();  // outside mu_: the call may end within
  return next;
}

absl::StatusOr<bool> StepCall::ReceiveAvailable(v1::StepResult* result, ParamAssembler* assembler) {
  auto broken = [&](absl::Status status) {
    Cancel();
    return status;
  };
  while (true) {
    bool ended = false;
    std::unique_ptr<grpc::ByteBuffer> next = TakeResponse(&ended);
    if (next == nullptr) {
      if (!ended) return false;
      OPTSTEP_RETURN_IF_ERROR(Finish());
      if (!got_result_) return absl::InternalError("Step stream ended OK without a StepResult");
      if (chunks_received_ != params_to_follow_) {
        return absl::InternalError(absl::StrCat("Step stream announced ", params_to_follow_,
                                                " parameter chunks and sent ", chunks_received_));
      }
      return true;
    }
    // The chunk's data stays in `next`'s slices until the assembler copies it.
    if (absl::Status decoded = DecodeStepResponse(*next, response_); !decoded.ok()) {
      return broken(absl::InternalError(decoded.message()));
    }
    if (!got_result_) {
      if (response_.kind != v1::StepResponse::kResult) {
        return broken(
            absl::InternalError("Step stream began with a parameter chunk, not a StepResult"));
      }
      *result = response_.result;
      got_result_ = true;
      params_to_follow_ = result->params_to_follow();
      continue;
    }
    if (response_.kind != v1::StepResponse::kParameter) {
      return broken(absl::InternalError("Step stream sent a second StepResult"));
    }
    ++chunks_received_;
    if (assembler == nullptr) {
      return broken(absl::InternalError("Step stream sent parameters that were not asked for"));
    }
    const TensorChunkView& chunk = response_.parameter;
    absl::StatusOr<DType> dtype =
        DTypeFromProto(static_cast<v1::DType>(chunk.dtype),
                       absl::StrCat("Step stream: parameter chunk of param_id ", chunk.param_id));
    absl::Status added = dtype.ok()
                             ? assembler->Add(chunk.param_id, chunk.offset, *dtype, chunk.data)
                             : absl::InternalError(dtype.status().message());
    if (!added.ok()) return broken(added);
  }
}

void StepCall::Cancel() {
  if (!started_) return;
  {
    absl::MutexLock lock(&mu_);
    cancel_requested_ = true;
  }
  context_->TryCancel();
  bool resumed;
  bool release;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;  // reads go on to the end, none paused, so that the call can end
    resumed = ResumeReadingLocked();
    release = EndWriterHoldLocked();
  }
  if (resumed) RemoveHold();
  if (release) RemoveHold();
  Finish().IgnoreError();
}

absl::Status StepCall::Finish() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return final_status_;
}

}  // namespace client_internal
}  // namespace optstep
