// CallerCalls: a caller runs a few calls at once and the rank a bounded number; the rest wait in
// a queue per caller, the callers served in turn, and a caller whose queue is full is refused
// RESOURCE_EXHAUSTED naming it. Work blocks on notifications, so the order is deterministic.

#include "server/rpc/caller_calls.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

class CallerCallsTest : public ::testing::Test {
 protected:
  // Runs call `name` of `caller`: it records that it began, then waits to be let go.
  absl::Status Call(const std::string& caller, const std::string& name, int64_t bytes = 0) {
    release_[name] = std::make_unique<absl::Notification>();
    absl::Notification* go = release_[name].get();
    return calls_.Run(
        caller, "Test",
        [this, name, go] {
          {
            absl::MutexLock lock(&mu_);
            began_.push_back(name);
          }
          go->WaitForNotification();
        },
        bytes);
  }
  // Lets call `name` end, and waits until `began` calls have begun.
  void Release(const std::string& name, size_t began) {
    release_[name]->Notify();
    absl::MutexLock lock(&mu_);
    auto enough = [this, began]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return began_.size() >= began; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  std::vector<std::string> Began() {
    absl::MutexLock lock(&mu_);
    return began_;
  }
  // Waits until no call runs (the last Done happens after its work returned).
  void AwaitIdle() {
    for (int i = 0; i < 10000 && calls_.running() > 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  }

  CallerCalls calls_{CallerCalls::Limits{/*per_caller=*/1, /*total=*/2, /*queued_per_caller=*/2,
                                         /*queued_bytes_per_caller=*/100}};
  std::map<std::string, std::unique_ptr<absl::Notification>> release_;
  absl::Mutex mu_;
  std::vector<std::string> began_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CallerCallsTest, CallsBeyondTheLimitsWaitTheirTurnAndCallersAreServedInTurn) {
  ASSERT_THAT(Call("alice", "a1"), IsOk());
  ASSERT_THAT(Call("alice", "a2"), IsOk());  // alice runs one at once: queued
  ASSERT_THAT(Call("alice", "a3"), IsOk());
  EXPECT_THAT(Call("alice", "a4"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "Test: caller 'alice' has 2 calls waiting on this rank already"));
  ASSERT_THAT(Call("bob", "b1"), IsOk());
  ASSERT_THAT(Call("bob", "b2"), IsOk());
  ASSERT_THAT(Call("carol", "c1"), IsOk());  // the rank runs two at once: queued
  EXPECT_EQ(calls_.running(), 2);
  EXPECT_EQ(calls_.queued(), 4);
  Release("a1", 3);
  Release("b1", 4);
  Release("a2", 5);
  Release("b2", 6);
  Release("c1", 6);
  Release("a3", 6);
  AwaitIdle();
  const std::vector<std::string> began = Began();
  ASSERT_EQ(began.size(), 6u);
  // a1 and b1 at once, a2 once a1 ended (their threads may begin in any order); then each
  // caller's waiting calls in turn: carol's does not wait behind alice's third.
  EXPECT_THAT(std::vector<std::string>(began.begin(), began.begin() + 3),
              testing::UnorderedElementsAre("a1", "b1", "a2"));
  EXPECT_EQ(std::vector<std::string>(began.begin() + 3, began.end()),
            (std::vector<std::string>{"b2", "c1", "a3"}));
  EXPECT_EQ(calls_.running(), 0);
  EXPECT_EQ(calls_.queued(), 0);
  // Nothing left of them: alice queues anew.
  ASSERT_THAT(Call("alice", "a5"), IsOk());
  Release("a5", 7);
  AwaitIdle();
}

// The requests of a caller's waiting calls are held until they run (a CreateSession's spec of up
// to the message limit): a caller may not queue more than its bytes, another caller may. Before,
// 8192 calls of 4 MiB each could wait, 32 GiB held.
TEST_F(CallerCallsTest, ACallersWaitingRequestsHoldBoundedBytes) {
  ASSERT_THAT(Call("alice", "a1", 1000), IsOk());  // runs at once: not waiting
  ASSERT_THAT(Call("alice", "a2", 60), IsOk());
  EXPECT_THAT(Call("alice", "a3", 60),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "Test: caller 'alice' has calls of 60 request bytes waiting on this rank "
                       "already; this one's 60 would pass the 100 one caller may"));
  ASSERT_THAT(Call("bob", "b1", 90), IsOk());
  ASSERT_THAT(Call("bob", "b2", 90), IsOk());  // the rank runs two at once: waits
  EXPECT_EQ(calls_.queued(), 2);
  Release("a1", 3);
  Release("b1", 4);
  Release("a2", 4);
  Release("b2", 4);
  AwaitIdle();
  ASSERT_THAT(Call("alice", "a4", 60), IsOk());  // nothing waits any more
  Release("a4", 5);
  AwaitIdle();
}

}  // namespace
}  // namespace optstep
