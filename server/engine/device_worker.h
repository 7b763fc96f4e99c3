#ifndef OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_
#define OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// One thread that runs the device work of every session in submission order, so that device
// calls are serialised and collectives are issued in the same order on every rank.
// Thread-safe.
class DeviceWorker {
 public:
  DeviceWorker();
  // Runs the tasks already queued, then joins the thread.
  ~DeviceWorker();

  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Queues `task`. Tasks posted after destruction began are dropped.
  void Post(std::function<void()> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_DEVICE_WORKER_H_
