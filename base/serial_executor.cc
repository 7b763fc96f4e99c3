#include "base/serial_executor.h"

#include <utility>

namespace optstep {

SerialExecutor::SerialExecutor()
    : state_(std::make_shared<State>()), thread_([state = state_] { Run(state); }) {}

SerialExecutor::~SerialExecutor() {
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

void SerialExecutor::Post(std::function<void()> task) {
  absl::MutexLock lock(&state_->mu);
  if (state_->stopping) return;
  state_->tasks.push_back(std::move(task));
}

void SerialExecutor::Run(std::shared_ptr<State> state) {
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
