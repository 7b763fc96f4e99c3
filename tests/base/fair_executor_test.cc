// FairExecutor takes its queues in turn, one task each, keeps each queue's order, drops (and
// tells) the tasks of a closed queue, reports the task that runs, and runs what is queued before
// its destructor returns.

#include "base/fair_executor.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

// A task that appends `name` to `log` (tasks never overlap: no lock), and to `dropped` when its
// queue closes first.
FairExecutor::Task Record(std::vector<std::string>& log, std::vector<std::string>& dropped,
                          std::string name) {
  return FairExecutor::Task{name, [&log, name] { log.push_back(name); },
                            [&dropped, name] { dropped.push_back(name); }};
}

// Blocks the executor's thread until `release` is notified, so that the tasks posted meanwhile
// are all queued when it picks the next one.
void Block(FairQueue& queue, absl::Notification& started, absl::Notification& release) {
  queue.Post({"block",
              [&] {
                started.Notify();
                release.WaitForNotification();
              },
              nullptr});
  started.WaitForNotification();
}

TEST(FairExecutorTest, TakesTheQueuesInTurnOneTaskEach) {
  std::vector<std::string> log, dropped;
  auto executor = std::make_shared<FairExecutor>();
  const FairExecutor::QueueId gate = executor->OpenQueue("gate");
  const FairExecutor::QueueId a = executor->OpenQueue("a");
  const FairExecutor::QueueId b = executor->OpenQueue("b");
  absl::Notification started, release;
  executor->Post(gate, {"block",
                        [&] {
                          started.Notify();
                          release.WaitForNotification();
                        },
                        nullptr});
  started.WaitForNotification();
  for (const char* name : {"a1", "a2", "a3", "a4"}) executor->Post(a, Record(log, dropped, name));
  for (const char* name : {"b1", "b2"}) executor->Post(b, Record(log, dropped, name));
  release.Notify();
  executor.reset();  // runs what is queued
  EXPECT_EQ(log, (std::vector<std::string>{"a1", "b1", "a2", "b2", "a3", "a4"}));
  EXPECT_TRUE(dropped.empty());
}

// An owner with three sessions of device work gets a turn as often as an owner with one: the
// groups in turn, then each group's queues in turn.
TEST(FairExecutorTest, TakesTheGroupsInTurnThenTheirQueues) {
  std::vector<std::string> log, dropped;
  auto executor = std::make_shared<FairExecutor>();
  FairQueue gate(executor, "gate");
  FairQueue a(executor, "a", "many"), b(executor, "b", "many"), c(executor, "c", "many");
  FairQueue d(executor, "d", "one");
  absl::Notification started, release;
  Block(gate, started, release);
  for (const char* name : {"a1", "a2"}) a.Post(Record(log, dropped, name));
  for (const char* name : {"b1", "b2"}) b.Post(Record(log, dropped, name));
  for (const char* name : {"c1", "c2"}) c.Post(Record(log, dropped, name));
  for (const char* name : {"d1", "d2", "d3"}) d.Post(Record(log, dropped, name));
  absl::Notification done;
  c.Post({"done", [&] { done.Notify(); }, nullptr});  // c2 runs last
  release.Notify();
  done.WaitForNotification();
  EXPECT_EQ(log, (std::vector<std::string>{"a1", "d1", "b1", "d2", "c1", "d3", "a2", "b2", "c2"}));
  // A closed queue leaves its group's turns; the group's others go on.
  absl::Notification started2, release2;
  Block(gate, started2, release2);
  log.clear();
  a.Post(Record(log, dropped, "a3"));
  b.Post(Record(log, dropped, "b3"));
  d.Post(Record(log, dropped, "d4"));
  absl::Notification done2;
  b.Post({"done", [&] { done2.Notify(); }, nullptr});  // b3, d4, then this
  a.Close();
  release2.Notify();
  done2.WaitForNotification();
  EXPECT_EQ(log, (std::vector<std::string>{"b3", "d4"}));
  EXPECT_EQ(dropped, (std::vector<std::string>{"a3"}));
}

TEST(FairExecutorTest, ClosingAQueueDropsItsWaitingAndLaterTasks) {
  std::vector<std::string> log, dropped;
  auto executor = std::make_shared<FairExecutor>();
  FairQueue gate(executor, "gate"), b(executor, "b");
  auto a = std::make_unique<FairQueue>(executor, "a");
  absl::Notification started, release;
  Block(gate, started, release);
  a->Post(Record(log, dropped, "a1"));
  b.Post(Record(log, dropped, "b1"));
  a->Post(Record(log, dropped, "a2"));
  a->Close();
  EXPECT_EQ(dropped, (std::vector<std::string>{"a1", "a2"}));  // told at once, in order
  a->Post(Record(log, dropped, "a3"));
  EXPECT_EQ(dropped.back(), "a3");
  a.reset();  // closing again does nothing
  release.Notify();
  absl::Notification done;
  b.Post({"done", [&] { done.Notify(); }, nullptr});
  done.WaitForNotification();
  EXPECT_EQ(log, (std::vector<std::string>{"b1"}));
  EXPECT_EQ(dropped.size(), 3u);
}

TEST(FairExecutorTest, ReportsTheRunningTaskAndItsQueue) {
  auto executor = std::make_shared<FairExecutor>();
  EXPECT_FALSE(executor->running().has_value());
  FairQueue queue(executor, "s1");
  absl::Notification started, release;
  const absl::Time before = absl::Now();
  Block(queue, started, release);
  std::optional<FairExecutor::Running> running = executor->running();
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->queue, "s1");
  EXPECT_EQ(running->label, "block");
  EXPECT_GE(running->started, before);
  release.Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (executor->running().has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(executor->running().has_value());
}

TEST(FairExecutorTest, DestructorRunsTheQueuedTasksFirst) {
  std::vector<std::string> log, dropped;
  auto executor = std::make_shared<FairExecutor>();
  const FairExecutor::QueueId id = executor->OpenQueue("q");
  for (const char* name : {"q1", "q2", "q3"}) executor->Post(id, Record(log, dropped, name));
  executor.reset();
  EXPECT_EQ(log, (std::vector<std::string>{"q1", "q2", "q3"}));
  EXPECT_TRUE(dropped.empty());
}

TEST(FairExecutorTest, MayBeDestroyedFromItsOwnTask) {
  auto executor = std::make_shared<FairExecutor>();
  const FairExecutor::QueueId id = executor->OpenQueue("q");
  absl::Notification ran;
  std::shared_ptr<FairExecutor> last = executor;
  executor.reset();
  last->Post(id, {"release",
                  [&ran, last = std::move(last)]() mutable {
                    last.reset();  // the last owner, on the executor's own thread
                    ran.Notify();
                  },
                  nullptr});
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

}  // namespace
}  // namespace optstep
