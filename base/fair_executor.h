#ifndef OPTSTEP_BASE_FAIR_EXECUTOR_H_
#define OPTSTEP_BASE_FAIR_EXECUTOR_H_

// File: fair_executor.h
//
// FairExecutor: one thread that runs the tasks of several queues, one task per turn, taking the
// groups of queues that have work in turn, and within a group its queues in turn (round robin at
// both levels). The engine has one per device: its "device worker", with one queue per session
// and one group per owner, so that a session with much device work holds another session's next
// task by at most one task of its own, and an owner with many sessions gets a turn as often as
// an owner with one. FairQueue: one queue of it, closed when destroyed.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstep {

// Runs posted tasks on a thread of its own, one at a time: the tasks of one queue in the order
// they were posted, the groups with work in turn and each group's queues with work in turn, one
// task each. A closed queue drops the tasks
// it holds and every later one, telling each (FairTask::dropped). Thread-safe: any thread may
// open, post to and close queues, and read running().
class FairExecutor {
 public:
  using QueueId = uint64_t;

  struct Task {
    std::string label;  // what the task does, for running() (logs, the watchdog)
    std::function<void()> run;
    std::function<void()> dropped;  // called instead of `run` when the queue closes first
  };
  // The task that runs now.
  struct Running {
    std::string queue;  // the queue's name
    std::string label;
    absl::Time started;
  };

  FairExecutor();
  // Runs the tasks already queued, then joins the thread. When called from a task of this
  // executor (the last owner of an object released inside its own task), the thread finishes
  // that task and the queues on its own and is detached instead.
  ~FairExecutor();

  FairExecutor(const FairExecutor&) = delete;
  FairExecutor& operator=(const FairExecutor&) = delete;

  // A new queue of `group`; `name` names it in running(). Ids are never reused.
  QueueId OpenQueue(std::string name, std::string group = "");
  // Queues `task` on `queue`. When the queue is closed (or destruction began), `task.dropped`
  // is called at once, on this thread, and `task.run` never.
  void Post(QueueId queue, Task task);
  // Drops the queue's tasks that have not started, calling their `dropped` on this thread in
  // order, and every task posted to it later. A task of the queue that runs now finishes.
  void CloseQueue(QueueId queue);
  // The task that runs now, if any.
  std::optional<Running> running() const;

 private:
  struct Queue {
    std::string name;
    std::string group;
    std::deque<Task> tasks;
  };
  // Shared with the thread, which may outlive the executor (see the destructor).
  struct State {
    mutable absl::Mutex mu;
    std::map<QueueId, Queue> queues ABSL_GUARDED_BY(mu);  // the open queues
    std::deque<std::string> turns ABSL_GUARDED_BY(mu);    // groups with tasks, in turn
    // Each of those groups' open queues with tasks, in turn.
    std::map<std::string, std::deque<QueueId>> group_turns ABSL_GUARDED_BY(mu);
    std::optional<Running> running ABSL_GUARDED_BY(mu);
    QueueId next_id ABSL_GUARDED_BY(mu) = 1;
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  static void Run(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

// One queue of a FairExecutor, which it keeps alive: closed (its waiting tasks dropped) by
// Close or when destroyed. Thread-safe.
class FairQueue {
 public:
  FairQueue(std::shared_ptr<FairExecutor> executor, std::string name, std::string group = "")
      : executor_(std::move(executor)),
        id_(executor_->OpenQueue(std::move(name), std::move(group))) {}
  ~FairQueue() { Close(); }

  FairQueue(const FairQueue&) = delete;
  FairQueue& operator=(const FairQueue&) = delete;

  // FairExecutor::Post to this queue.
  void Post(FairExecutor::Task task) { executor_->Post(id_, std::move(task)); }
  // FairExecutor::CloseQueue of this queue; later calls do nothing.
  void Close() { executor_->CloseQueue(id_); }

 private:
  const std::shared_ptr<FairExecutor> executor_;
  const FairExecutor::QueueId id_;
};

}  // namespace optstep

#endif  // OPTSTEP_BASE_FAIR_EXECUTOR_H_
