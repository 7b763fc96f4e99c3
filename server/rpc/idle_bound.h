#ifndef OPTSTEP_SERVER_RPC_IDLE_BOUND_H_
#define OPTSTEP_SERVER_RPC_IDLE_BOUND_H_

// How long a server stream may wait on its caller (docs/security.md, "Stream bounds"). A caller
// that stops taking part while its connection stays up (a stopped process, a client that never
// reads) would otherwise make the stream hold what it holds for ever: a step's or a pull's
// snapshot of the parameters, an export's copy of the state, an init's staged values, and the
// session's stream slots.

#include <grpcpp/alarm.h>
#include <grpcpp/server_context.h>

#include <functional>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace optstep {

// The clock of one stream's waits on its caller: a read it has not answered with a message, or a
// write it has not taken (its flow-control window is full). One grpc::Alarm at a time goes off at
// the earliest moment the bound could be passed; the stream asks Passed() then.
//
// Thread-compatible: the stream calls every method under its own lock; the alarm's callback
// (`fire`) runs on a gRPC thread and takes that lock itself.
class IdleBound {
 public:
  IdleBound() = default;
  IdleBound(const IdleBound&) = delete;
  IdleBound& operator=(const IdleBound&) = delete;

  absl::Duration timeout() const { return timeout_; }

  // Bounds the waits by `timeout` (zero or infinite: no bound, and no alarm) and sets the first
  // alarm; `fire` runs each time one goes off (not when Stop cancels it) and is to call Passed()
  // under the stream's lock. Keep in it a weak reference to the stream.
  void Start(absl::Duration timeout, std::function<void()> fire);
  // A read or a write is out: the stream waits on its caller from now, unless it did already.
  void Waiting();
  // The caller sent a message or took one (or the stream broke): it is not waited on.
  void Heard();
  // At an alarm: how long the stream has waited on its caller when that is the bound or more;
  // else nothing, and the next alarm is set.
  std::optional<absl::Duration> Passed();
  // No more alarms; answers the one set, to be destroyed outside the stream's lock (destroying it
  // cancels it, and its callback may run meanwhile).
  std::unique_ptr<grpc::Alarm> Stop();

 private:
  bool bounded() const;
  void Arm(absl::Time at);

  absl::Duration timeout_ = absl::ZeroDuration();
  std::function<void()> fire_;
  bool waiting_ = false;
  absl::Time since_ = absl::Now();  // of the wait, or of the last time the caller was heard
  std::unique_ptr<grpc::Alarm> alarm_;
  std::unique_ptr<grpc::Alarm> fired_;  // destroyed at the next arming or with this
};

// The idle bound of a reactor, with a lock of its own so that the reactor can call it under its
// own or under none: once the caller has not sent the next message (kReads: InitParameters,
// ImportStateDict) or taken the last one written (kWrites: the OwnedWriteReactor streams) for the
// bound, the call is cancelled, so that the read or write out fails and the reactor ends the
// stream as cancelled; idled() then says why.
// Thread-safe.
class CallIdleWatch {
 public:
  // What the stream waits on its caller for.
  enum class Waits { kReads, kWrites };

  // Watches the call of `context` (valid until Stop) with `timeout` (zero or infinite: no bound);
  // `what` names the stream in the log line of a call cancelled so.
  static std::shared_ptr<CallIdleWatch> Start(grpc::CallbackServerContext* context,
                                              absl::Duration timeout, const char* what,
                                              Waits waits);
  ~CallIdleWatch();

  // A read or write is out / its message came or was taken (or the stream broke).
  void Waiting() ABSL_LOCKS_EXCLUDED(mu_);
  void Heard() ABSL_LOCKS_EXCLUDED(mu_);
  // How long the caller had been silent when the call was cancelled for it; nothing otherwise.
  std::optional<absl::Duration> idled() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration timeout() const { return timeout_; }
  // No more alarms and no more cancelling (the reactor's OnDone: the context goes).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CallIdleWatch(grpc::CallbackServerContext* context, absl::Duration timeout, const char* what,
                Waits waits)
      : context_(context), timeout_(timeout), what_(what), waits_(waits) {}
  void OnAlarm() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  grpc::CallbackServerContext* context_ ABSL_GUARDED_BY(mu_);
  const absl::Duration timeout_;
  const char* const what_;
  const Waits waits_;
  IdleBound bound_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Duration> idled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_IDLE_BOUND_H_
