#ifndef OPTSTEP_BASE_SERIAL_EXECUTOR_H_
#define OPTSTEP_BASE_SERIAL_EXECUTOR_H_

// File: serial_executor.h
//
// SerialExecutor: one thread that runs posted tasks one at a time, in the order they were posted.
// The engine has one per device (the device math of every session, serialised: its "device
// worker"); each session has one as its step coordinator; the rank group has one that relays
// abort votes to the other ranks.

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// Runs tasks in submission order on a thread of its own. Thread-safe: any thread may Post.
class SerialExecutor {
 public:
  SerialExecutor();
  // Runs the tasks already queued, then joins the thread. When called from a task of this
  // executor (the last owner of an object released inside its own task), the thread finishes
  // that task and the queue on its own and is detached instead.
  ~SerialExecutor();

  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `task`. Tasks posted after destruction began are dropped.
  void Post(std::function<void()> task);

 private:
  // Shared with the thread, which may outlive the executor (see the destructor).
  struct State {
    absl::Mutex mu;
    std::deque<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  static void Run(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_BASE_SERIAL_EXECUTOR_H_
