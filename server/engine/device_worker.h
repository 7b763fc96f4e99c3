#ifndef OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_
#define OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// One thread that runs tasks in submission order. The engine has one per device (device math of
// every session, serialised); each session has one as its coordinator. Thread-safe.
class DeviceWorker {
 public:
  DeviceWorker();
  // Runs the tasks already queued, then joins the thread. When called from a task of this
  // worker (the last owner of a session released inside its own task), the thread finishes
  // that task and the queue on its own and is detached instead.
  ~DeviceWorker();

  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Queues `task`. Tasks posted after destruction began are dropped.
  void Post(std::function<void()> task);

 private:
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

#endif  // OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_
