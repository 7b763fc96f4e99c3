// Sessions share the rank's device worker fairly: a session whose device work is slow (its
// optimizer's kernels delayed by a fault-injecting device) holds another session's step by at
// most one slice per task; closing it cancels its queued and running work at the next slice, and
// returns at once; the watchdog turns the engine unhealthy while one task runs too long, and
// healthy again when it ends. A tenant's initial values, being written, hold no lock of the rank,
// and a trainer's new attempt waits for the copies of its earlier stream.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BeginStep;
using ::optstep::testutil::Eventually;
using ::optstep::testutil::FaultInjectingDevice;
using ::optstep::testutil::FaultInjector;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::SendGradient;
using ::optstep::testutil::StatusIs;

constexpr int kSlowParams = 30;
// Each Lion update of the slow session takes this long: its step takes kSlowParams of them.
constexpr absl::Duration kSlowUpdate = absl::Milliseconds(100);

// `count` parameters of 4 elements stepped by Lion, one trainer.
SessionConfig LionConfig(int count) {
  SessionConfig config;
  for (int p = 0; p < count; ++p) config.params.push_back(ParamInfo{"p" + std::to_string(p), {4}});
  SubOptimizerConfig lion;
  lion.name = "lion";
  lion.kind = "lion";
  config.chain.sub_optimizers = {lion};
  config.step_deadline = absl::Seconds(30);
  return config;
}

class DeviceSharingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = testutil::FaultInjectingCpuDevice();
    ASSERT_NE(device_, nullptr);
    EngineOptions options;
    options.device_watchdog = absl::Milliseconds(300);
    engine_ = testutil::MakeEngineOn(device_, options);
    ASSERT_NE(engine_, nullptr);
  }

  std::shared_ptr<Session> Create(const SessionConfig& config) {
    return testutil::MakeSession(*engine_, config);
  }

  // Trainer 0 sends step `step` of `session` (a gradient of ones) and commits it.
  void CommitStep(Session& session, uint64_t step, Outcome& outcome) {
    const StepHandle c = BeginStep(session, step, 0);
    uint64_t elements = 0;
    for (int p = 0; p < static_cast<int>(session.config().params.size()); ++p) {
      const int64_t numel = session.config().params[p].numel();
      ASSERT_THAT(SendGradient(session, c, p, 0, std::vector<float>(numel, 1.0f)), IsOk());
      elements += numel;
    }
    ASSERT_THAT(session.Commit(c, elements, outcome.Callback()), IsOk());
  }

  FaultInjector& faults() { return device_->faults(); }

  std::shared_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(DeviceSharingTest, ASlowSessionHoldsAnotherByOneSliceAndClosingItCancelsItsWork) {
  std::shared_ptr<Session> slow = Create(LionConfig(kSlowParams));
  std::shared_ptr<Session> fast = Create(testutil::TwoParamConfig(testutil::AdamW(0.01, 0.0)));
  ASSERT_NE(slow, nullptr);
  ASSERT_NE(fast, nullptr);
  faults().DelayCalls("Lion", 1, FaultInjector::kForever, kSlowUpdate);

  Outcome slow_step;
  CommitStep(*slow, 1, slow_step);
  ASSERT_TRUE(Eventually([&] { return faults().calls("Lion") >= 1; }, absl::Seconds(10)));

  // The fast step's device tasks each wait for one slice of the slow step (one Lion update),
  // not for the rest of it (kSlowParams updates).
  absl::Time started = absl::Now();
  Outcome fast_step;
  CommitStep(*fast, 1, fast_step);
  ASSERT_THAT(fast_step.Wait().status(), IsOk());
  EXPECT_LT(absl::Now() - started, absl::Seconds(1));
  EXPECT_FALSE(slow_step.HasBeenNotified());

  // Closing the slow session returns at once and stops its step at the next slice: at most the
  // Lion update that runs goes on.
  const int64_t updates_at_close = faults().calls("Lion");
  started = absl::Now();
  ASSERT_THAT(engine_->CloseSession(slow->id()), IsOk());
  EXPECT_LT(absl::Now() - started, kSlowUpdate);
  ASSERT_TRUE(slow_step.WaitFor(absl::Seconds(5)));
  EXPECT_THAT(slow_step.result().status(), StatusIs(absl::StatusCode::kUnavailable,
                                                    "closed: its step 1 optimizer was cancelled"));
  absl::SleepFor(3 * kSlowUpdate);
  EXPECT_LE(faults().calls("Lion"), updates_at_close + 1);

  // The other session's next step does not wait for the closed session's work.
  started = absl::Now();
  Outcome next;
  CommitStep(*fast, 2, next);
  ASSERT_THAT(next.Wait().status(), IsOk());
  EXPECT_LT(absl::Now() - started, absl::Seconds(1));
  EXPECT_EQ(next.result()->step, 2u);
}

// A snapshot of a large session's parameters (a pull, or the step's reply) holds another
// session's step by one slice (one parameter's copy here), not by the whole copy. Before, it was
// one task: a tenant that pulled after each initial value (which drops the cached snapshot)
// held every other tenant's steps for as long as its whole session took to copy.
TEST_F(DeviceSharingTest, ASnapshotOfALargeSessionHoldsAnotherByOneSlice) {
  std::shared_ptr<Session> large = Create(LionConfig(kSlowParams));
  std::shared_ptr<Session> fast = Create(testutil::TwoParamConfig(testutil::AdamW(0.01, 0.0)));
  ASSERT_NE(large, nullptr);
  ASSERT_NE(fast, nullptr);
  // The large session's copies (and the fast step's, among them): 30 x 150 ms in all.
  const int64_t base = faults().calls("CopyToHost");
  faults().DelayCalls("CopyToHost", base + 1, base + kSlowParams, absl::Milliseconds(150));
  struct Pull {  // outlives this test's frame, whatever it asserts
    absl::Notification done;
    absl::Status status = absl::UnknownError("not pulled");
  };
  auto pull = std::make_shared<Pull>();
  large->GetSnapshot(DType::kF32, [pull](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) {
    pull->status = s.status();
    pull->done.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return faults().calls("CopyToHost") > base; }, absl::Seconds(10)));
  const absl::Time started = absl::Now();
  Outcome fast_step;
  CommitStep(*fast, 1, fast_step);
  ASSERT_THAT(fast_step.Wait().status(), IsOk());
  // Its own copies are among the slowed ones: a few slices, well within the 4.5 s of the copy.
  EXPECT_LT(absl::Now() - started, absl::Milliseconds(3500));
  EXPECT_FALSE(pull->done.HasBeenNotified()) << "the copy ended before the fast step";
  pull->done.WaitForNotification();
  EXPECT_THAT(pull->status, IsOk());
}

TEST_F(DeviceSharingTest, WatchdogMarksTheEngineUnhealthyWhileATaskRunsTooLong) {
  std::shared_ptr<Session> session = Create(LionConfig(1));
  ASSERT_NE(session, nullptr);
  EXPECT_TRUE(engine_->healthy());
  EXPECT_FALSE(engine_->device_activity().stalled);
  // One Lion update stuck for 3 s, ten times the 300 ms watchdog: on a loaded machine the task
  // may begin a while after the commit, and the stall must still be seen while it lasts.
  faults().DelayCalls("Lion", faults().calls("Lion") + 1, faults().calls("Lion") + 1,
                      absl::Milliseconds(3000));
  Outcome outcome;
  CommitStep(*session, 1, outcome);
  ASSERT_TRUE(Eventually([&] { return !engine_->healthy(); }, absl::Milliseconds(2500)));
  const Engine::DeviceActivity stalled = engine_->device_activity();
  EXPECT_TRUE(stalled.stalled);
  EXPECT_GT(stalled.running_for, absl::Milliseconds(300));
  ASSERT_THAT(outcome.Wait().status(), IsOk());
  EXPECT_TRUE(Eventually([&] { return engine_->healthy(); }, absl::Seconds(1)));
  EXPECT_FALSE(engine_->device_activity().stalled);
  EXPECT_EQ(engine_->device_activity().running_for, absl::ZeroDuration());
}

// A tenant's initial values are written outside its session's lock and the engine's, a slice at
// a time (here their one copy to the device is slowed): the rank's health, which asks every
// session, and another tenant's lookups answer meanwhile. (Written under the session's lock,
// they held the health check, and with it every lookup of every session, for the whole write.)
TEST_F(DeviceSharingTest, InitialValuesBeingWrittenHoldNoLockOfTheRank) {
  std::shared_ptr<Session> slow = Create(LionConfig(1));
  std::shared_ptr<Session> other = Create(LionConfig(1));
  ASSERT_NE(slow, nullptr);
  ASSERT_NE(other, nullptr);
  const int64_t base = faults().calls("CopyFromHost");
  faults().DelayCalls("CopyFromHost", base + 1, base + 1, absl::Seconds(2));
  const std::vector<float> values(4, 1.0f);
  const std::vector<Session::InitPiece> pieces = {
      {0, 0, DType::kF32, absl::string_view(reinterpret_cast<const char*>(values.data()), 16)}};
  absl::Notification written;
  absl::Status status;
  slow->InitValues(pieces, [&](absl::Status answered) {
    status = std::move(answered);
    written.Notify();
  });
  ASSERT_TRUE(Eventually([&] { return faults().calls("CopyFromHost") > base; }, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  (void)engine_->healthy();
  EXPECT_THAT(engine_->GetSession(other->id()).status(), IsOk());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(written.HasBeenNotified());
  written.WaitForNotification();
  EXPECT_THAT(status, IsOk());
}

// A trainer that begins a step again while a copy of its earlier stream's gradient is still under
// way (here slowed) waits for it: the new attempt's bytes are the ones the step applies, not the
// earlier stream's landing over them. (The new attempt dropped the earlier ranges at once, and
// the late copy wrote its 1s over the 2s.)
TEST_F(DeviceSharingTest, ANewAttemptWaitsForTheCopiesOfTheTrainersEarlierStream) {
  SessionConfig config = LionConfig(1);
  config.chain.sub_optimizers = {testutil::Sgd(0.1)};  // Lion's sign would hide the difference
  std::shared_ptr<Session> reference = Create(config);
  std::shared_ptr<Session> session = Create(config);
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(session, nullptr);
  Outcome applied;
  {
    const StepHandle c = BeginStep(*reference, 1, 0);
    ASSERT_THAT(SendGradient(*reference, c, 0, 0, std::vector<float>(4, 2.0f)), IsOk());
    ASSERT_THAT(reference->Commit(c, 4, applied.Callback()), IsOk());
    ASSERT_THAT(applied.Wait().status(), IsOk());
  }
  const int64_t base = faults().calls("CopyFromHost");
  faults().DelayCalls("CopyFromHost", base + 1, base + 1, absl::Milliseconds(500));
  const StepHandle first = BeginStep(*session, 1, 0);
  absl::Status sent;
  std::thread earlier(
      [&] { sent = SendGradient(*session, first, 0, 0, std::vector<float>(4, 1.0f)); });
  ASSERT_TRUE(Eventually([&] { return faults().calls("CopyFromHost") > base; }, absl::Seconds(10)));
  const StepHandle again = BeginStep(*session, 1, 0);
  ASSERT_THAT(SendGradient(*session, again, 0, 0, std::vector<float>(4, 2.0f)), IsOk());
  Outcome outcome;
  ASSERT_THAT(session->Commit(again, 4, outcome.Callback()), IsOk());
  ASSERT_THAT(outcome.Wait().status(), IsOk());
  earlier.join();
  EXPECT_THAT(sent, IsOk());
  EXPECT_EQ(testutil::ParamValues(*session, 0), testutil::ParamValues(*reference, 0));
}

}  // namespace
}  // namespace optstep
