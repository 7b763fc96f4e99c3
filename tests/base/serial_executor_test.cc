// SerialExecutor runs tasks one at a time in the order they were posted, runs what is queued
// before its destructor returns, and may be destroyed from one of its own tasks.

#include "base/serial_executor.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(SerialExecutorTest, RunsTasksInSubmissionOrderOnOneThread) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  {
    SerialExecutor executor;
    for (int i = 0; i < 100; ++i) {
      executor.Post([&, i] {
        order.push_back(i);  // no lock: tasks never overlap
        threads.push_back(std::this_thread::get_id());
      });
    }
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const std::thread::id& id : threads) EXPECT_EQ(id, threads[0]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
}

TEST(SerialExecutorTest, DestructorRunsTheQueuedTasksFirst) {
  absl::Notification release;
  int ran = 0;
  {
    SerialExecutor executor;
    executor.Post([&] { release.WaitForNotification(); });
    for (int i = 0; i < 10; ++i) executor.Post([&] { ++ran; });
    release.Notify();
  }
  EXPECT_EQ(ran, 10);
}

TEST(SerialExecutorTest, MayBeDestroyedByItsOwnTask) {
  auto executor = std::make_shared<std::unique_ptr<SerialExecutor>>(
      std::make_unique<SerialExecutor>());
  absl::Notification first, second;
  (*executor)->Post([&first, executor] {
    executor->reset();  // the destructor runs on the executor's own thread
    first.Notify();
  });
  first.WaitForNotification();
  EXPECT_EQ(*executor, nullptr);
  // A fresh executor still works after the detached one finished.
  SerialExecutor other;
  other.Post([&] { second.Notify(); });
  second.WaitForNotification();
}

}  // namespace
}  // namespace optstep
