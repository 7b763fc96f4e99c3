#include "server/rpc/step_reactor.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "base/log_budget.h"
#include "glog/logging.h"
#include "server/engine/memory_budget.h"
#include "server/rpc/convert.h"
#include "server/rpc/idle_bound.h"
#include "server/rpc/open_streams.h"
#include "server/rpc/param_chunker.h"
#include "server/rpc/shared_step.h"
#include "server/rpc/stream_charges.h"
#include "wire/chunk.h"
#include "wire/grpc_status.h"
#include "wire/raw_step_codec.h"

namespace optstep {
namespace {

// The Step streams of each trainer of a session open on this rank. A stream the rank does not
// read (it committed and waits for the step's other trainers, up to the step deadline) holds up
// to its window and a message; a trainer opens one per step, and its redo may come before the
// rank ended the stream it replaces: a few per trainer at most. Counted per trainer, so that one
// whose streams linger (on half-open connections) takes no slot of the session's others.
constexpr int kOpenStepStreamsPerTrainer = 4;
OpenStreams& OpenSteps() {
  static OpenStreams* const streams = new OpenStreams();
  return *streams;
}

// A Step stream whose gradient waits for the trainers before it (REPLICATED gradients are summed
// in trainer order) reads nothing meanwhile: the transport holds up to its window beside the
// message in hand, as long as those trainers take. Each owner has this many such streams in the
// headroom (while it has room); its others take those bytes from the budget, or end.
constexpr int kWaitingStepStreamsPerOwner = 8;
HeadroomPlaces& WaitingStepStreamsInHeadroom() {
  static HeadroomPlaces* const streams = new HeadroomPlaces(kWaitingStepStreamsPerOwner);
  return *streams;
}

class StepReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                          public LiveStepStreams::Stream,
                          public std::enable_shared_from_this<StepReactor> {
 public:
  StepReactor(grpc::CallbackServerContext* context, Engine* engine, Caller caller,
              const StepStreamLimits& limits, NewStepsStatus new_steps, LiveStepStreams* streams)
      : context_(context),
        engine_(engine),
        caller_(std::move(caller)),
        limits_(limits),
        new_steps_(std::move(new_steps)),
        streams_(streams) {}

  void Start(std::shared_ptr<StepReactor> self) {
    const absl::Status added = streams_ != nullptr
                                   ? streams_->Add(self, CallerKey(caller_, context_->peer()))
                                   : absl::OkStatus();
    self_ = std::move(self);
    absl::MutexLock lock(&mu_);
    if (!added.ok()) return FinishLocked(ToGrpcStatus(added));
    if (finished_) return;  // a shutdown ended it as soon as it was added
    ReadLocked();
    std::weak_ptr<StepReactor> weak = weak_from_this();
    idle_.Start(limits_.idle_timeout, [weak] {
      if (auto self = weak.lock()) self->OnIdleAlarm();
    });
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<Session> session;
    StepHandle handle;
    uint64_t num_elements = 0;
    {
      absl::MutexLock lock(&mu_);
      // The sentinel read after the commit (kWaiting) tells nothing of the answer the trainer is
      // to take: a half-close or a message there must not restart the wait of a blocked write.
      if (phase_ != Phase::kWaiting) NoteTrainerLocked();
      if (finished_) return;
      if (!ok) {
        // Half-close or broken stream before the commit: the contribution stays pending, so the
        // trainer may reconnect and resend.
        if (phase_ != Phase::kWaiting) {
          FinishLocked(
              grpc::Status(grpc::StatusCode::CANCELLED, "stream closed before the commit"));
        }
        return;
      }
      if (phase_ == Phase::kWaiting) {
        // The sentinel read after the commit took a message: nothing may follow a StepCommit.
        FinishLocked(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         absl::StrCat("step stream: a message after the StepCommit of step ",
                                      handle_.step, " (one step per stream); the commit stands")));
        // A finish deferred behind a write the trainer may never take: the stream ends now.
        if (write_in_flight_) context_->TryCancel();
        return;
      }
      absl::Status bounded = CountBytesLocked(request_.Length());
      if (!bounded.ok()) return FinishLocked(ToGrpcStatus(bounded));
      absl::Status decoded = DecodeStepRequest(request_, view_);
      if (!decoded.ok()) return FinishLocked(ToGrpcStatus(decoded));
      if (view_.kind != v1::StepRequest::kCommit) {
        absl::Status status = Handle();
        if (!status.ok()) return FinishLocked(ToGrpcStatus(status));
        if (waiting_for_turn_) return;  // reads on once the chunk is added (OnChunkAdded)
        request_.Clear();               // releases the received slices
        ReadLocked();
        return;
      }
      if (phase_ != Phase::kReceiving) {
        return FinishLocked(ToGrpcStatus(
            absl::InvalidArgumentError("step stream: StepCommit before the StepHeader")));
      }
      phase_ = Phase::kWaiting;
      ReleaseWaitingHoldLocked();  // no chunk waits once the commit is taken (nor reads)
      // A sentinel read while the step waits (no idle bound: the wait is the other trainers'):
      // a trainer that sends on after its commit is ended at its first message, rather than
      // made to fill the stream's window, unread, for as long as the step waits.
      request_.Clear();
      StartRead(&request_);
      session = session_;
      handle = handle_;
      num_elements = view_.commit.num_elements();
    }
    // Without the lock: the session may call back on this thread (a replayed step).
    std::weak_ptr<StepReactor> weak = weak_from_this();
    absl::Status status =
        session->Commit(handle, num_elements, [weak](absl::StatusOr<StepOutcome> outcome) {
          if (auto self = weak.lock()) self->OnStepDone(std::move(outcome));
        });
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      FinishLocked(ToGrpcStatus(status));
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    NoteTrainerLocked();
    write_in_flight_ = false;
    if (deferred_finish_) {  // ended while this write was out
      slot_.Release();
      Finish(*std::move(deferred_finish_));
      deferred_finish_.reset();
      return;
    }
    if (finished_) return;
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    WriteNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    std::unique_ptr<grpc::Alarm> alarm;
    {
      absl::MutexLock lock(&mu_);
      alarm = idle_.Stop();
      // The stream is over, its window let go: a chunk that still waits in the session keeps
      // this reactor, not the session's slot (let go as it finished, if it did).
      slot_.Release();
    }
    alarm.reset();  // cancels: its callback returns at once, without the lock
    if (streams_ != nullptr) streams_->Remove(this);
    self_.reset();
  }

  bool EndUnavailable(absl::string_view why) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    FinishLocked(grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        session_ == nullptr
            ? std::string(why)
            : absl::StrCat("session '", session_->id(), "' step ", handle_.step, ": ", why)));
    return true;
  }

 private:
  enum class Phase { kHeader, kReceiving, kWaiting };

  absl::Status Handle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (view_.kind) {
      case v1::StepRequest::kHeader:
        return HandleHeader(view_.header);
      case v1::StepRequest::kGradient:
        return HandleGradient(view_.gradient);
      default:
        return absl::InvalidArgumentError("step stream: empty StepRequest");
    }
  }

  absl::Status HandleHeader(const v1::StepHeader& header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kHeader) {
      return absl::InvalidArgumentError("step stream: a second StepHeader; one step per stream");
    }
    auto session = FindSession(*engine_, caller_, header.session_id());
    if (!session.ok()) return session.status();
    auto begin = StepBeginFromProto(header);
    if (!begin.ok()) return begin.status();
    absl::Status trainer = (*session)->CheckTrainer(begin->trainer);
    if (!trainer.ok()) return trainer;
    slot_ = OpenSteps().TryOpen(session->get(), kOpenStepStreamsPerTrainer, begin->trainer);
    if (!slot_.held()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "step stream: ", kOpenStepStreamsPerTrainer, " Step streams of trainer ", begin->trainer,
          " of session '", (*session)->id(), "' are open on this rank already"));
    }
    // This rank or a peer shutting down: the other trainers of a step already begun may still
    // join it, so that it completes; nothing new starts.
    if (!(*session)->step_pending()) {
      absl::Status open = new_steps_();
      if (!open.ok()) return open;
    }
    begin->stream_params = true;  // the chunker follows the snapshot as the step fills it
    absl::Status ids = CheckParamIds(**session, header.return_param_ids(), "return_param_ids");
    if (!ids.ok()) return ids;
    if (header.shared_memory_segment() != 0) {
      auto segment = SharedSegmentOf(**session, header, *begin);
      if (!segment.ok()) return segment.status();
      shared_.emplace(*std::move(segment));
    }
    // OWNERS storage, or return_owned: this rank returns the parameters it owns (none: the
    // result only).
    std::optional<std::vector<uint32_t>> served = ServedParamIds(
        **session, header.return_param_ids(), header.return_owned() || shared_.has_value());
    if (!served.has_value()) begin->return_params = false;
    auto handle = (*session)->Begin(*begin);
    if (!handle.ok()) return handle.status();
    session_ = *std::move(session);
    handle_ = *handle;
    if (served.has_value()) return_ids_ = *std::move(served);
    phase_ = Phase::kReceiving;
    if (streams_ != nullptr) streams_->Named(this);
    return shared_.has_value() ? AddSharedGradientsLocked() : absl::OkStatus();
  }

  // The segment a step header names, checked against the session, the trainer and the header;
  // sets `begin` for it.
  absl::StatusOr<std::shared_ptr<const SharedSegment>> SharedSegmentOf(const Session& session,
                                                                       const v1::StepHeader& header,
                                                                       StepBegin& begin) {
    if (begin.return_dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step of session '", session.id(), "' with shared_memory_segment ",
          header.shared_memory_segment(), ": return_dtype must be FP32, the segment's, not ",
          DTypeName(begin.return_dtype)));
    }
    begin.return_owned = true;
    return engine_->shared_segments().Find(session.id(), static_cast<int>(header.trainer_id()),
                                           header.shared_memory_segment());
  }

  // Adds the shared segment's gradients until one waits for its trainer's turn (OnChunkAdded
  // calls again) or all are added.
  absl::Status AddSharedGradientsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::weak_ptr<StepReactor> weak = weak_from_this();
    // What the stream holds while a gradient waits is taken before that one is queued.
    auto all = shared_->AddGradients(
        *session_, handle_,
        [weak](absl::Status added) {
          if (auto self = weak.lock()) self->OnChunkAdded(std::move(added));
        },
        [this] {
          mu_.AssertHeld();  // called within, under the lock
          return HoldWhileWaitingLocked();
        });
    if (!all.ok()) return all.status();
    waiting_for_turn_ = !*all;
    return absl::OkStatus();
  }

  absl::Status HandleGradient(const TensorChunkView& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kReceiving) {
      return absl::InvalidArgumentError("step stream: gradient chunk before the StepHeader");
    }
    if (shared_.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step stream: a gradient chunk of param_id ", chunk.param_id,
                       " in a step that reads its gradients from shared_memory_segment ",
                       shared_->segment_id()));
    }
    absl::StatusOr<ChunkHeader> checked = CheckChunkHeader(
        chunk.param_id, chunk.offset, static_cast<v1::DType>(chunk.dtype), chunk.data_bytes,
        absl::StrCat("gradient chunk of param_id ", chunk.param_id));
    if (!checked.ok()) return checked.status();
    // A chunk that waits for its trainer's turn (REPLICATED) keeps this reactor, and so the
    // received slices it points into, alive; the stream reads nothing more until it is added.
    // What the stream holds meanwhile is taken first, so that a chunk refused is not queued
    // (it would keep the message in hand until its turn).
    absl::Status held = session_->WouldWait(handle_, checked->param_id) ? HoldWhileWaitingLocked()
                                                                        : absl::OkStatus();
    if (!held.ok()) return held;
    std::weak_ptr<StepReactor> weak = weak_from_this();
    auto fate = session_->AddGradient(handle_, checked->param_id, checked->offset, checked->dtype,
                                      chunk.data, shared_from_this(), [weak](absl::Status added) {
                                        if (auto self = weak.lock())
                                          self->OnChunkAdded(std::move(added));
                                      });
    if (!fate.ok()) return fate.status();
    waiting_for_turn_ = *fate == Session::ChunkFate::kWaiting;
    return absl::OkStatus();
  }

  // Takes what the stream may make the rank hold while it waits for its turn and reads nothing
  // (limits_.waiting_bytes): a place of its owner's in the headroom, or else those bytes from the
  // budget. RESOURCE_EXHAUSTED when neither is to be had: the stream ends, nothing of it applied
  // (its trainer never committed on it). Taken once, as the stream's first chunk is to wait,
  // and held until its commit (the trainer's next chunks wait as likely), or its end; a stream
  // that ends while a chunk waits holds it until the chunk is added or dropped (the chunk keeps
  // the message in hand, and this reactor, until then).
  absl::Status HoldWhileWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (limits_.waiting_bytes <= 0 || waiting_hold_ != nullptr) return absl::OkStatus();
    absl::StatusOr<std::shared_ptr<const void>> held = HoldCopy(
        *engine_, WaitingStepStreamsInHeadroom(), session_->config().owner, limits_.waiting_bytes,
        absl::StrCat("step stream of trainer ", handle_.trainer, " of session '", session_->id(),
                     "'"),
        absl::StrCat("its window and a message, held while its gradients wait for the trainers "
                     "before it; ",
                     kWaitingStepStreamsPerOwner,
                     " such streams of an owner wait in the rank's headroom while it has room"));
    if (!held.ok()) return held.status();
    waiting_hold_ = *std::move(held);
    return absl::OkStatus();
  }
  void ReleaseWaitingHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { waiting_hold_.reset(); }

  // A chunk that waited for its turn was added (or dropped): the stream reads on.
  void OnChunkAdded(absl::Status added) {
    absl::MutexLock lock(&mu_);
    if (finished_) ReleaseWaitingHoldLocked();  // the chunk is in, or dropped: the message goes
    if (finished_ || !waiting_for_turn_) return;
    waiting_for_turn_ = false;
    request_.Clear();
    if (!added.ok()) return FinishLocked(ToGrpcStatus(added));
    if (shared_.has_value()) {
      absl::Status more = AddSharedGradientsLocked();
      if (!more.ok()) return FinishLocked(ToGrpcStatus(more));
      if (waiting_for_turn_) return;
    }
    ReadLocked();
  }

  // Called by the engine once the step is applied or aborted (the worker thread, or this stream's
  // own thread for a replayed step).
  void OnStepDone(absl::StatusOr<StepOutcome> outcome) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!outcome.ok()) return FinishLocked(ToGrpcStatus(outcome.status()));
    const StepOutcome& o = *outcome;
    if (o.params != nullptr && !shared_.has_value()) {
      chunker_.emplace(o.params, return_ids_, kMaxChunkBytes);
    }
    v1::StepResult* result = result_.mutable_result();
    result->set_step(o.step);
    result->set_skipped(o.skipped);
    result->set_grad_norm(o.grad_norm);
    result->set_clipped(o.clipped);
    result->set_params_to_follow(chunker_ ? chunker_->num_chunks() : 0);
    if (shared_.has_value() && o.params != nullptr) {
      shared_params_ = o.params;
      result->set_params_in_shared_memory(true);
      return WriteSharedParamsLocked();
    }
    WriteResultLocked();
  }

  // The StepResult goes out (after the parameters, when they go through shared memory).
  void WriteResultLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool own = false;
    grpc::Status serialised =
        grpc::SerializationTraits<v1::StepResponse>::Serialize(result_, &response_, &own);
    if (!serialised.ok()) return FinishLocked(serialised);
    WriteLocked();
  }

  // Writes the returned parameters into the shared segment as the step makes them ready, then
  // the result.
  void WriteSharedParamsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::weak_ptr<StepReactor> weak = weak_from_this();
    auto all = shared_->WriteParams(*shared_params_, return_ids_, [weak] {
      if (auto self = weak.lock()) self->OnSharedParamsReady();
    });
    if (!all.ok()) return FinishLocked(ToGrpcStatus(all.status()));
    if (!*all) return;  // OnSharedParamsReady calls again
    shared_params_.reset();
    StepObserver* observer = engine_->options().step_observer.get();
    if (observer != nullptr) observer->OnBytesOut(shared_->bytes_written());
    WriteResultLocked();
  }

  void OnSharedParamsReady() {
    absl::MutexLock lock(&mu_);
    if (finished_ || shared_params_ == nullptr) return;
    WriteSharedParamsLocked();
  }

  // Reads and writes wait on the trainer: the idle bound runs while one is outstanding.
  void ReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    idle_.Waiting();
    StartRead(&request_);
  }
  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    idle_.Waiting();
    write_in_flight_ = true;
    StartWrite(&response_);
  }
  // The trainer sent a message or took an answer (or the stream broke).
  void NoteTrainerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { idle_.Heard(); }

  // Counts a received message against the stream's byte bound (known once the header named
  // the session; the header itself is bounded by the server's message size).
  absl::Status CountBytesLocked(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bytes_received_ += static_cast<int64_t>(bytes);
    if (session_ == nullptr) return absl::OkStatus();
    if (max_bytes_ == 0) {
      max_bytes_ = limits_.max_bytes > 0
                       ? limits_.max_bytes
                       : 2 * session_->stats().buffer_bytes + kStepStreamSlackBytes;
    }
    if (bytes_received_ <= max_bytes_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "step stream: ", bytes_received_, " bytes received before the commit, over the bound of ",
        max_bytes_, " bytes per stream (",
        limits_.max_bytes > 0 ? "the server's max stream bytes"
                              : "twice the session's gradient bytes on this rank",
        "); nothing of this stream was applied"));
  }

  void OnIdleAlarm() {
    absl::MutexLock lock(&mu_);
    // A finish deferred behind a write the trainer does not take still waits on the trainer.
    if (finished_ && !write_in_flight_) return;
    const std::optional<absl::Duration> idle = idle_.Passed();
    if (!idle) return;
    const std::string waited =
        absl::StrCat(absl::FormatDuration(*idle), ", over the stream idle timeout of ",
                     absl::FormatDuration(idle_.timeout()));
    FinishLocked(ToGrpcStatus(absl::DeadlineExceededError(
        phase_ == Phase::kWaiting
            ? absl::StrCat("step stream: the trainer did not take its answer for ", waited,
                           "; the step was applied")
            : absl::StrCat("step stream: nothing from the trainer for ", waited,
                           "; nothing of this stream was applied"))));
    // A trainer that does not take its answer leaves the write out for ever, and the Finish
    // waiting for it (with the snapshot the answer is cut from): the stream is cancelled, so
    // that the write fails and the stream ends now.
    if (write_in_flight_) context_->TryCancel();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    size_t bytes = 0;
    absl::StatusOr<ParamChunker::Progress> next = ParamChunker::Progress::kDone;
    if (chunker_) {
      std::weak_ptr<StepReactor> weak = weak_from_this();
      next = chunker_->NextStepResponse(&response_, &bytes, [weak] {
        if (auto self = weak.lock()) self->OnParamsReady();
      });
    }
    if (!next.ok()) return FinishLocked(ToGrpcStatus(next.status()));
    switch (*next) {
      case ParamChunker::Progress::kChunk:
        // Egress is timed from the first parameter chunk: the result goes out before the step
        // runs, and the wait for stepped parameters is the step's time, not egress's.
        if (egress_started_ == absl::InfinitePast()) egress_started_ = absl::Now();
        ReportEgress(bytes, /*done=*/false);
        WriteLocked();
        return;
      case ParamChunker::Progress::kWaiting:
        waiting_for_params_ = true;  // the step is still filling the snapshot
        return;
      case ParamChunker::Progress::kDone:
        ReportEgress(0, /*done=*/true);
        FinishLocked(grpc::Status::OK);
        return;
    }
  }

  // The step marked more parameters ready (or failed). Wakes may come when no write waits.
  void OnParamsReady() {
    absl::MutexLock lock(&mu_);
    if (finished_ || !waiting_for_params_) return;
    waiting_for_params_ = false;
    WriteNextLocked();
  }

  void ReportEgress(size_t bytes, bool done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StepObserver* observer = engine_->options().step_observer.get();
    if (observer == nullptr) return;
    if (bytes > 0) observer->OnBytesOut(static_cast<int64_t>(bytes));
    if (done && egress_started_ != absl::InfinitePast()) {
      observer->OnPhase(StepObserver::Phase::kEgress, absl::Now() - egress_started_);
    }
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    // The call ends and the transport lets go of the stream; a chunk that still waits keeps the
    // message in hand, and the hold with it (OnChunkAdded).
    if (!waiting_for_turn_) ReleaseWaitingHoldLocked();
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) LogError(status);
    // One operation on the sending side at a time: a Finish waits for the write that is out
    // (its OnWriteDone comes, failed if the stream is cancelled meanwhile).
    if (write_in_flight_) {
      deferred_finish_ = std::move(status);
      return;
    }
    slot_.Release();  // before the caller hears the end: OnDone may come after its next stream
    Finish(std::move(status));
  }

  // The one log line of a failed Step stream, with the trainer's context (CallTracker counts
  // Step errors but leaves their line to this).
  void LogError(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t dropped = 0;  // a trainer may fail stream after stream
    if (!CallerLogBudget().Take(&dropped)) return;
    LOG(WARNING) << "event=step_error session=" << (session_ ? session_->id() : "-")
                 << " step=" << handle_.step << " trainer=" << handle_.trainer
                 << " rank=" << engine_->options().rank << " code="
                 << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
                 << " message=\"" << LogValue(status.error_message()) << "\""
                 << DroppedBefore(dropped);
  }

  grpc::CallbackServerContext* const context_;  // the call's: valid until OnDone
  Engine* const engine_;
  const Caller caller_;
  const StepStreamLimits limits_;
  const NewStepsStatus new_steps_;
  LiveStepStreams* const streams_;  // may be null
  std::shared_ptr<StepReactor> self_;

  absl::Mutex mu_;
  grpc::ByteBuffer request_ ABSL_GUARDED_BY(mu_);
  StepRequestView view_ ABSL_GUARDED_BY(mu_);  // of request_
  grpc::ByteBuffer response_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kHeader;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  OpenStreams::Slot slot_ ABSL_GUARDED_BY(mu_);  // the session's, in OpenSteps
  StepHandle handle_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> return_ids_ ABSL_GUARDED_BY(mu_);
  // StepHeader.shared_memory_segment: its gradients in, its parameters out; the snapshot the
  // parameters are written from while they are.
  std::optional<SharedStepIo> shared_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ParamSnapshot> shared_params_ ABSL_GUARDED_BY(mu_);
  v1::StepResponse result_ ABSL_GUARDED_BY(mu_);
  std::optional<ParamChunker> chunker_ ABSL_GUARDED_BY(mu_);
  bool waiting_for_params_ ABSL_GUARDED_BY(mu_) = false;
  bool waiting_for_turn_ ABSL_GUARDED_BY(mu_) = false;  // a chunk waits in the session
  // What the stream holds while it waits (HoldWhileWaitingLocked): a place, or bytes.
  std::shared_ptr<const void> waiting_hold_ ABSL_GUARDED_BY(mu_);  // HoldCopy's
  absl::Time egress_started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> deferred_finish_ ABSL_GUARDED_BY(mu_);  // FinishLocked's, meanwhile
  // The bounds (StepStreamLimits).
  int64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // resolved at the first message after the header
  IdleBound idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartStepReactor(
    grpc::CallbackServerContext* context, Engine* engine, Caller caller,
    const StepStreamLimits& limits, NewStepsStatus new_steps, LiveStepStreams* streams) {
  auto reactor = std::make_shared<StepReactor>(context, engine, std::move(caller), limits,
                                               std::move(new_steps), streams);
  StepReactor* raw = reactor.get();
  raw->Start(std::move(reactor));
  return raw;
}

}  // namespace optstep
