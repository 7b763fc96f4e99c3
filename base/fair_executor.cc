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

FairExecutor::QueueId FairExecutor::OpenQueue(std::string name, std::string group) {
  absl::MutexLock lock(&state_->mu);
  const QueueId id = state_->next_id++;
  Queue& queue = state_->queues[id];
  queue.name = std::move(name);
  queue.group = std::move(group);
  return id;
}

void FairExecutor::Post(QueueId queue, Task task) {
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->queues.find(queue);
    if (!state_->stopping && it != state_->queues.end()) {
      if (it->second.tasks.empty()) {
        std::deque<QueueId>& group = state_->group_turns[it->second.group];
        if (group.empty()) state_->turns.push_back(it->second.group);
        group.push_back(queue);
      }
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
    const std::string group = it->second.group;
    state_->queues.erase(it);
    auto waiting = state_->group_turns.find(group);
    if (waiting != state_->group_turns.end()) {
      std::deque<QueueId>& queues = waiting->second;
      queues.erase(std::remove(queues.begin(), queues.end(), queue), queues.end());
      if (queues.empty()) {
        state_->group_turns.erase(waiting);
        std::deque<std::string>& turns = state_->turns;
        turns.erase(std::remove(turns.begin(), turns.end(), group), turns.end());
      }
    }
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
      const std::string group = std::move(state->turns.front());
      state->turns.pop_front();
      std::deque<QueueId>& queues = state->group_turns.at(group);
      const QueueId id = queues.front();
      queues.pop_front();
      Queue& queue = state->queues.at(id);
      task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      if (!queue.tasks.empty()) queues.push_back(id);  // its next task waits its turn
      if (queues.empty()) {
        state->group_turns.erase(group);
      } else {
        state->turns.push_back(group);  // so does the group's next queue
      }
      state->running = Running{queue.name, task.label, absl::Now()};
    }
    task.run();
  }
}

}  // namespace optstep
