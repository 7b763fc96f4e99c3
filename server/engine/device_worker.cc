#include "server/engine/device_worker.h"

#include <utility>

namespace optstep {

DeviceWorker::DeviceWorker()
    : state_(std::make_shared<State>()), thread_([state = state_] { Run(state); }) {}

DeviceWorker::~DeviceWorker() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void DeviceWorker::Post(std::function<void()> task) {
  absl::MutexLock lock(&state_->mu);
  if (state_->stopping) return;
  state_->tasks.push_back(std::move(task));
}

void DeviceWorker::Run(std::shared_ptr<State> state) {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&state->mu);
      state->mu.Await(absl::Condition(
          +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
            return s->stopping || !s->tasks.empty();
          },
          state.get()));
      if (state->tasks.empty()) return;  // stopping, and nothing left
      task = std::move(state->tasks.front());
      state->tasks.pop_front();
    }
    task();
  }
}

}  // namespace optstep
