#ifndef OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_
#define OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "server/rpc/idle_bound.h"

namespace optstep {

// The common part of the server-streaming reactors that answer from another thread (the
// session's coordinator): the reactor owns itself (through shared_ptr, so that callbacks can
// hold weak references) until OnDone, writes one message at a time under `mu_`, and finishes
// exactly once. A write its caller does not take within the stream idle bound (CallIdleWatch)
// cancels the call, so that what the stream holds for it is let go. Derived classes implement
// WriteNextLocked, which writes the next message (WriteLocked) or finishes; one that is told of
// new messages from outside (not only when a write is done) asks WritingLocked first.
template <typename Response, typename Derived>
class OwnedWriteReactor : public grpc::ServerWriteReactor<Response>,
                          public std::enable_shared_from_this<Derived> {
 public:
  void OnWriteDone(bool ok) final {
    idle_->Heard();
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    WriteNextLocked();
  }
  void OnCancel() final {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() final {
    idle_->Stop();
    Released();
    self_.reset();
  }
  // Whether the stream ended: cancelled (by its caller, or for not taking a write), or finished
  // with its answer.
  bool finished() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

 protected:
  // Keeps the reactor alive until OnDone, and bounds by `idle_timeout` the wait for the caller of
  // `context` (the call's, valid until OnDone) to take each write; `what` names the stream in the
  // log line of a call cancelled so.
  void Own(std::shared_ptr<Derived> self, grpc::CallbackServerContext* context,
           absl::Duration idle_timeout, const char* what) {
    self_ = std::move(self);
    idle_ = CallIdleWatch::Start(context, idle_timeout, what, CallIdleWatch::Waits::kWrites);
  }
  // Writes `response`, which must stay as it is until WriteNextLocked is called again.
  void WriteLocked(const Response* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    idle_->Waiting();
    writing_ = true;
    this->StartWrite(response);
  }
  // A write is out: the next one waits for OnWriteDone.
  bool WritingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return writing_; }
  // Told at OnDone (outside mu_), before the reactor lets itself go: gRPC is done with the call.
  virtual void Released() {}
  virtual void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    this->Finish(std::move(status));
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

 private:
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<Derived> self_;
  // Set by Own, before any write; cancels the call once a write is not taken within the bound
  // (its write fails and OnCancel finishes it; the caller sees CANCELLED).
  std::shared_ptr<CallIdleWatch> idle_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_
