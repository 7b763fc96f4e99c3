#ifndef OPTSTEP_CLIENT_CPP_STEP_CALL_H_
#define OPTSTEP_CLIENT_CPP_STEP_CALL_H_

// One trainer's Step stream to one rank: header -> gradient chunks -> commit -> half-close, then
// the StepResult and (from the rank that returns parameters) the parameter chunks. A raw call
// on gRPC's callback API (grpc::GenericStub): gradient chunks go out as slices that refer to the
// caller's memory, never copied into a protobuf message (gradient_wire.h), and the streams to
// several ranks run at the same time. Internal to client/.
// Thread-compatible: one thread drives a call; gRPC's threads run the reactions.

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/client_callback.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/chunking.h"
#include "client/cpp/param_assembler.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "wire/raw_step_codec.h"

namespace optstep {
namespace client_internal {

// Counts what arrives on the calls that share it (a response or a call's end), so that one thread
// reads several calls as their responses come instead of one call to its end while the others'
// responses pile up. Thread-safe.
class Arrivals final {
 public:
  uint64_t count() const ABSL_LOCKS_EXCLUDED(mu_);
  // Something arrived: wakes the waiter.
  void Add() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until count() is no longer `seen`.
  void AwaitAfter(uint64_t seen) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

class StepCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Prepares the call on `channel`; Send starts it. Each response and the call's end count in
  // `arrivals` (may be null).
  StepCall(std::shared_ptr<grpc::Channel> channel, absl::Time deadline, bool wait_for_ready,
           std::shared_ptr<Arrivals> arrivals = nullptr);
  // Cancels a call still running and waits until gRPC has released the caller's gradient bytes.
  ~StepCall() override;

  StepCall(const StepCall&) = delete;
  StepCall& operator=(const StepCall&) = delete;

  // Starts the call, which writes `header`, the contribution's chunks and a StepCommit carrying
  // its element count, then half-closes, on gRPC's threads. Returns at once. REQUIRES: the
  // gradient bytes the contribution points to outlive this call object. Same as Open, Append
  // and Commit.
  void Send(const v1::StepHeader& header, const RankContribution& contribution);

  // A stream fed over time: Open starts the call with `header`; each Append queues chunks behind
  // those already queued (written on gRPC's threads as the stream takes them); Commit queues the
  // StepCommit of `num_elements` and the half-close. Each returns at once. REQUIRES: Open once,
  // before Append and Commit; nothing after Commit; the chunks' bytes outlive this call object.
  void Open(const v1::StepHeader& header);
  void Append(absl::Span<const GradientSlice> chunks);
  void Commit(uint64_t num_elements);

  // Reads without waiting, for reading several calls on one thread: takes the responses that
  // have arrived (the StepResult into `*result`, the parameter chunks that follow it into
  // `assembler`; null: none may follow) and answers true once the call ended and every response
  // was taken, false while more may come. An error is the call's status (the server's code and
  // message) or INTERNAL when the server broke the stream's protocol, and cancels the call.
  // REQUIRES: the same `result` and `assembler` at every call for this call object.
  absl::StatusOr<bool> ReceiveAvailable(v1::StepResult* result, ParamAssembler* assembler);

  // Waits up to `wait` for the call's first response or its end; true once either came.
  bool AwaitAnswer(absl::Duration wait);
  // The error the call ended with; OK while it runs or when it ended well.
  absl::Status EndedWith();

  // Ends the call early (after an error elsewhere) and waits for it to finish.
  void Cancel();

  // Reactions (gRPC's threads).
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Writes the next message: a chunk, the commit, or the half-close; with nothing queued and no
  // commit yet, marks the writer idle (Append and Commit wake it).
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next write unless one is in flight.
  void WakeWriterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once the writer can start no more writes: ends its hold on the call and answers true; the
  // caller then removes the hold (RemoveHold) once it has released mu_.
  bool EndWriterHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next response that has arrived, or null when none has; `*ended` says then whether the
  // call is done (nothing more will come).
  std::unique_ptr<grpc::ByteBuffer> TakeResponse(bool* ended);
  // Starts the read that OnReadDone left paused, if it did; true then, and the caller removes
  // the hold (RemoveHold) once it has released mu_.
  bool ResumeReadingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for OnDone and answers the call's status.
  absl::Status Finish();
  // gRPC released a slice of gradient bytes.
  static void Unpin(void* call);

  std::unique_ptr<grpc::ClientContext> context_;  // reset once the call is done
  grpc::GenericStub stub_;
  const std::shared_ptr<Arrivals> arrivals_;
  bool started_ = false;
  // The reading side (ReceiveAvailable's thread).
  // The response being read (reused); its views are valid while its buffer is read.
  StepResponseView response_;
  bool got_result_ = false;
  uint64_t params_to_follow_ = 0;
  uint64_t chunks_received_ = 0;

  absl::Mutex mu_;
  std::vector<GradientSlice> chunks_ ABSL_GUARDED_BY(mu_);  // queued and written, in order
  size_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> num_elements_ ABSL_GUARDED_BY(mu_);  // set by Commit
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;       // a write is in flight
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;   // the half-close was started
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;  // the stream broke under a write
  // The call is held (AddHold) for writes started outside a reaction, from Open until
  // EndWriterHoldLocked.
  bool writer_hold_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer write_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer read_ ABSL_GUARDED_BY(mu_);
  // Responses read from gRPC, at most kReadAhead; when full, no read is started (paused_)
  // until the reader takes one.
  std::deque<std::unique_ptr<grpc::ByteBuffer>> responses_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;  // holds the call (AddHold) while set
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Cancel() began: a CANCELLED end is this client's own, not the server's.
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  // Apart from mu_: dropping a buffer under mu_ may release a slice, and so call Unpin.
  absl::Mutex pin_mu_ ABSL_ACQUIRED_AFTER(mu_);
  int pinned_ ABSL_GUARDED_BY(pin_mu_) = 0;  // gradient slices gRPC still holds
};

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_STEP_CALL_H_
