#ifndef OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_
#define OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_

#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// The common part of the server-streaming reactors that answer from another thread (the
// session's coordinator): the reactor owns itself (through shared_ptr, so that callbacks can
// hold weak references) until OnDone, writes one message at a time under `mu_`, and finishes
// exactly once. Derived classes implement WriteNextLocked, which writes the next message or
// finishes.
template <typename Response, typename Derived>
class OwnedWriteReactor : public grpc::ServerWriteReactor<Response>,
                          public std::enable_shared_from_this<Derived> {
 public:
  void OnWriteDone(bool ok) final {
    absl::MutexLock lock(&mu_);
    if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    WriteNextLocked();
  }
  void OnCancel() final {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() final { self_.reset(); }

 protected:
  // Keeps the reactor alive until OnDone.
  void Own(std::shared_ptr<Derived> self) { self_ = std::move(self); }
  virtual void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    this->Finish(std::move(status));
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

 private:
  std::shared_ptr<Derived> self_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_OWNED_WRITE_REACTOR_H_
