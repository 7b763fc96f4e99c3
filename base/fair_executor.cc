#include "base/fair_executor.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace optstep {
namespace {

void TellDropped(std::vector<FairExecutor::Task>& tasks) {
  for (FairExecutor::Task& task : tasks) {
    if (task.dropped) task.dropped();
  }
}

}  // namespace

FairExecutor::FairExecutor()
    : state_(std::make_shared<State>()), thread_([state = state_] { Run(state); }) {}

FairExecutor::~FairExecutor() {
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

FairExecutor::QueueId FairExecutor::OpenQueue(std::string name) {
  absl::MutexLock lock(&state_->mu);
  const QueueId id = state_->next_id++;
  state_->queues[id].name = std::move(name);
  return id;
}

void FairExecutor::Post(QueueId queue, Task task) {
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->queues.find(queue);
    if (!state_->stopping && it != state_->queues.end()) {
      if (it->second.tasks.empty()) state_->turns.push_back(queue);
      it->second.tasks.push_back(std::move(task));
      return;
    }
  }
  if (task.dropped) task.dropped();
}

void FairExecutor::CloseQueue(QueueId queue) {
  std::vector<Task> dropped;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->queues.find(queue);
    if (it == state_->queues.end()) return;
    for (Task& task : it->second.tasks) dropped.push_back(std::move(task));
    state_->queues.erase(it);
    std::deque<QueueId>& turns = state_->turns;
    turns.erase(std::remove(turns.begin(), turns.end(), queue), turns.end());
  }
  TellDropped(dropped);
}

std::optional<FairExecutor::Running> FairExecutor::running() const {
  absl::MutexLock lock(&state_->mu);
  return state_->running;
}

void FairExecutor::Run(std::shared_ptr<State> state) {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&state->mu);
      state->running.reset();
      state->mu.Await(absl::Condition(
          +[](State* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->stopping || !s->turns.empty(); },
          state.get()));
      if (state->turns.empty()) return;  // stopping, and nothing left
      const QueueId id = state->turns.front();
      state->turns.pop_front();
      Queue& queue = state->queues.at(id);
      task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      if (!queue.tasks.empty()) state->turns.push_back(id);  // its next task waits its turn
      state->running = Running{queue.name, task.label, absl::Now()};
    }
    task.run();
  }
}

}  // namespace optstep
