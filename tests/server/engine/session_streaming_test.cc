// A commit with StepBegin::stream_params gets the step's result before the optimizer runs and a
// snapshot that fills as parameters are stepped; once the last one is ready the step counts as
// applied (the next step may begin), and the values equal those of a trainer that waited.

#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::Floats;
using ::optstep::testutil::IsOk;

// Waits until `ready` answers true. `ready(wake)` asks the snapshot's readiness, which calls
// `wake` once when it changes while it answers false.
void WaitUntil(const std::function<absl::StatusOr<bool>(std::function<void()>)>& ready) {
  absl::Mutex mu;
  int wakes = 0;
  for (;;) {
    int seen;
    {
      absl::MutexLock lock(&mu);
      seen = wakes;
    }
    absl::StatusOr<bool> now = ready([&] {
      absl::MutexLock lock(&mu);
      ++wakes;
    });
    ASSERT_THAT(now.status(), IsOk());
    if (*now) return;
    std::pair<int*, int> woken(&wakes, seen);
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::pair<int*, int>* w) { return *w->first > w->second; }, &woken));
  }
}

// Waits until `n` parameters of `snapshot` are ready.
void WaitForAll(const ParamSnapshot& snapshot, size_t n) {
  for (size_t index = 0; index < n; ++index) {
    WaitUntil([&](std::function<void()> wake) -> absl::StatusOr<bool> {
      auto next = snapshot.readiness->Get(index, std::move(wake));
      if (!next.ok()) return next.status();
      return next->has_value();
    });
  }
}

// Waits until the step ended on the rank (ParamReadiness::End), as a trainer's stream does before
// it ends: only then does the trainer begin the next step.
void WaitForEnd(const ParamSnapshot& snapshot) {
  WaitUntil([&](std::function<void()> wake) { return snapshot.readiness->Ended(std::move(wake)); });
}

TEST(SessionStreamingTest, ResultFirstThenParametersAsTheyAreStepped) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.5));
  config.chain.clip_grad = 0.0;
  config.num_trainers = 2;
  config.mode = GradientMode::kSharded;
  std::shared_ptr<Session> created = testutil::MakeSession(*engine, config);
  ASSERT_NE(created, nullptr);
  Session& session = *created;

  StepBegin streaming;
  streaming.step = 1;
  streaming.trainer = 0;
  streaming.stream_params = true;
  StepBegin waiting = streaming;
  waiting.trainer = 1;
  waiting.stream_params = false;
  auto c0 = session.Begin(streaming);
  auto c1 = session.Begin(waiting);
  ASSERT_THAT(c0.status(), IsOk());
  ASSERT_THAT(c1.status(), IsOk());
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {-2, 0, 2};
  ASSERT_THAT(session.AddGradient(*c0, 0, 0, DType::kF32, w.data(), w.size() * 4), IsOk());
  ASSERT_THAT(session.AddGradient(*c1, 1, 0, DType::kF32, b.data(), b.size() * 4), IsOk());

  absl::Notification got0, got1;
  absl::StatusOr<StepOutcome> out0, out1;
  ASSERT_THAT(session.Commit(*c0, 6,
                             [&](absl::StatusOr<StepOutcome> o) {
                               out0 = std::move(o);
                               got0.Notify();
                             }),
              IsOk());
  ASSERT_THAT(session.Commit(*c1, 3,
                             [&](absl::StatusOr<StepOutcome> o) {
                               out1 = std::move(o);
                               got1.Notify();
                             }),
              IsOk());
  got0.WaitForNotification();
  ASSERT_THAT(out0.status(), IsOk());
  EXPECT_EQ(out0->step, 1u);
  ASSERT_NE(out0->params, nullptr);
  ASSERT_NE(out0->params->readiness, nullptr);
  WaitForAll(*out0->params, 2);
  WaitForEnd(*out0->params);

  // The step ended on this rank (ParamReadiness::End), as a stream ends only then: step 2 may
  // begin at once.
  StepBegin next = streaming;
  next.step = 2;
  EXPECT_THAT(session.Begin(next).status(), IsOk());

  got1.WaitForNotification();
  ASSERT_THAT(out1.status(), IsOk());
  EXPECT_EQ(out1->step, 1u);
  for (int p : {0, 1}) {
    EXPECT_EQ(out0->params->values[p], out1->params->values[p]) << "param " << p;
  }
  EXPECT_EQ(Floats(out0->params->values[0]), std::vector<float>({-0.5f, -1, -1.5f, -2, -2.5f, -3}));
  EXPECT_EQ(Floats(out0->params->values[1]), std::vector<float>({1, 0, -1}));
}

// The last step's snapshot is released once the next step applies, before that step's snapshot
// is made, so that a rank does not keep two copies of the parameters it returns while it fills
// the new one (its storage goes back to the session's SnapshotPool, whose reuse
// snapshot_pool_test checks). A reader that asks during the step gets the new step's parameters.
TEST(SessionStreamingTest, LastSnapshotReleasedOnceTheNextStepApplies) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.5));
  config.chain.clip_grad = 0.0;
  std::shared_ptr<Session> created = testutil::MakeSession(*engine, config);
  ASSERT_NE(created, nullptr);
  Session& session = *created;
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {-2, 0, 2};
  std::weak_ptr<const ParamSnapshot> last;
  bool last_released = false;
  absl::Notification pulled;  // asked during step 2
  std::shared_ptr<const ParamSnapshot> during;
  for (uint64_t step = 1; step <= 2; ++step) {
    StepBegin begin;
    begin.step = step;
    begin.stream_params = true;
    auto c = session.Begin(begin);
    ASSERT_THAT(c.status(), IsOk());
    ASSERT_THAT(session.AddGradient(*c, 0, 0, DType::kF32, w.data(), w.size() * 4), IsOk());
    ASSERT_THAT(session.AddGradient(*c, 1, 0, DType::kF32, b.data(), b.size() * 4), IsOk());
    absl::Notification got;
    std::shared_ptr<const ParamSnapshot> params;
    // Called once the result is agreed, with the snapshot this step fills.
    ASSERT_THAT(session.Commit(*c, 9,
                               [&](absl::StatusOr<StepOutcome> o) {
                                 ASSERT_THAT(o.status(), IsOk());
                                 last_released = last.expired();
                                 params = o->params;
                                 if (step == 2) {
                                   session.GetSnapshot(DType::kF32, [&](auto s) {
                                     if (s.ok()) during = *s;
                                     pulled.Notify();
                                   });
                                 }
                                 got.Notify();
                               }),
                IsOk());
    got.WaitForNotification();
    ASSERT_NE(params, nullptr);
    WaitForAll(*params, 2);
    WaitForEnd(*params);
    last = params;
  }
  EXPECT_TRUE(last_released);
  pulled.WaitForNotification();
  ASSERT_NE(during, nullptr);
  EXPECT_EQ(during->step, 2u);
  EXPECT_EQ(Floats(during->values[1]), std::vector<float>({2, 0, -2}));
}

}  // namespace
}  // namespace optstep
