// The statistics of each gradient for the global norm are computed as soon as the gradient is
// complete, while the others are still coming in (server/engine/gradient_statistics.h): before
// the next parameter's chunks and the commit, once per gradient, with the same results as when
// they were computed after the last commit (the REPLICATED mean taken once, a gradient that was
// written again computed again). And AdamW is clipped in its update, without a pass of its own.

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BeginStep;
using ::optstep::testutil::FaultInjectingDevice;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::ParamValues;
using ::optstep::testutil::SendGradient;

constexpr char kStats[] = "ComputeGradientStats";

// Within 10 s.
template <typename Condition>
bool Eventually(Condition condition) {
  return testutil::Eventually(condition, absl::Seconds(10));
}

// "w" (2x3) and "b" (3), AdamW, clipping at 1 (every gradient below is clipped).
SessionConfig Config(GradientMode mode, int trainers) {
  SessionConfig config = testutil::TwoParamConfig(testutil::AdamW(0.1, 0.01));
  config.mode = mode;
  config.num_trainers = trainers;
  return config;
}

std::vector<float> Gradient(int param, float base) {
  const int64_t numel = param == 0 ? 6 : 3;
  std::vector<float> values(numel);
  for (int64_t i = 0; i < numel; ++i) values[i] = base + 0.37f * static_cast<float>(i * (i - 2));
  return values;
}

class IngestStatisticsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = testutil::FaultInjectingCpuDevice();
    ASSERT_NE(device_, nullptr);
    engine_ = testutil::MakeEngineOn(device_);
    ASSERT_NE(engine_, nullptr);
  }

  int64_t stats_calls() { return device_->faults().calls(kStats); }

  // The pre-clip norm of `grads` as the step computes it: each gradient's sum of squares on the
  // device (fp64, fixed blocks), added in parameter order.
  double Norm(const std::vector<std::vector<float>>& grads) {
    double total = 0.0;
    for (const std::vector<float>& g : grads) {
      absl::StatusOr<Tensor> t =
          device_->base().Allocate(DType::kF32, {static_cast<int64_t>(g.size())});
      EXPECT_THAT(t.status(), IsOk());
      EXPECT_THAT(device_->base().CopyFromHost(g.data(), DType::kF32,
                                               static_cast<int64_t>(g.size()), *t, 0),
                  IsOk());
      absl::StatusOr<GradientStats> stats = device_->base().ComputeGradientStats(*t);
      EXPECT_THAT(stats.status(), IsOk());
      total += stats->sum_squares;
    }
    return std::sqrt(total);
  }

  std::shared_ptr<FaultInjectingDevice> device_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(IngestStatisticsTest, AGradientsStatisticsAreComputedBeforeTheNextParameterArrives) {
  std::shared_ptr<Session> session =
      testutil::MakeSession(*engine_, Config(GradientMode::kSharded, 1));
  ASSERT_NE(session, nullptr);
  const std::vector<std::vector<float>> grads = {Gradient(0, 1.5f), Gradient(1, -2.0f)};
  const int64_t before = stats_calls();
  const StepHandle c = BeginStep(*session, 1, 0);
  ASSERT_THAT(SendGradient(*session, c, 0, 0, grads[0]), IsOk());
  // "w" is complete: its statistics are computed now, not after the commit.
  EXPECT_TRUE(Eventually([&] { return stats_calls() == before + 1; }));
  ASSERT_THAT(SendGradient(*session, c, 1, 0, grads[1]), IsOk());
  EXPECT_TRUE(Eventually([&] { return stats_calls() == before + 2; }));
  Outcome outcome;
  ASSERT_THAT(session->Commit(c, 9, outcome.Callback()), IsOk());
  ASSERT_THAT(outcome.Wait().status(), IsOk());
  EXPECT_EQ(outcome.result()->grad_norm, Norm(grads));  // the same bits
  EXPECT_TRUE(outcome.result()->clipped);
  EXPECT_EQ(stats_calls(), before + 2);  // none computed again after the commit
}

TEST_F(IngestStatisticsTest, AGradientWrittenAgainHasItsStatisticsComputedAgain) {
  std::shared_ptr<Session> session =
      testutil::MakeSession(*engine_, Config(GradientMode::kSharded, 1));
  ASSERT_NE(session, nullptr);
  const int64_t before = stats_calls();
  const StepHandle first = BeginStep(*session, 1, 0);
  ASSERT_THAT(SendGradient(*session, first, 0, 0, Gradient(0, 9.0f)), IsOk());
  ASSERT_TRUE(Eventually([&] { return stats_calls() == before + 1; }));
  // The trainer begins again (a broken stream) and sends another gradient of "w".
  const StepHandle again = BeginStep(*session, 1, 0);
  const std::vector<std::vector<float>> grads = {Gradient(0, 1.5f), Gradient(1, -2.0f)};
  ASSERT_THAT(SendGradient(*session, again, 0, 0, grads[0]), IsOk());
  ASSERT_THAT(SendGradient(*session, again, 1, 0, grads[1]), IsOk());
  Outcome outcome;
  ASSERT_THAT(session->Commit(again, 9, outcome.Callback()), IsOk());
  ASSERT_THAT(outcome.Wait().status(), IsOk());
  EXPECT_EQ(outcome.result()->grad_norm, Norm(grads));
}

TEST_F(IngestStatisticsTest, TheReplicatedMeanIsTakenOnceAsTheHostMeanWouldBe) {
  std::shared_ptr<Session> replicated =
      testutil::MakeSession(*engine_, Config(GradientMode::kReplicated, 2));
  std::shared_ptr<Session> sharded =
      testutil::MakeSession(*engine_, Config(GradientMode::kSharded, 1));
  ASSERT_NE(replicated, nullptr);
  ASSERT_NE(sharded, nullptr);
  const std::vector<std::vector<float>> from[2] = {{Gradient(0, 1.5f), Gradient(1, -2.0f)},
                                                   {Gradient(0, 0.25f), Gradient(1, 3.0f)}};
  std::vector<std::vector<float>> mean(2);
  for (int p = 0; p < 2; ++p) {
    for (size_t i = 0; i < from[0][p].size(); ++i) {
      mean[p].push_back((from[0][p][i] + from[1][p][i]) * 0.5f);
    }
  }
  const int64_t before = stats_calls();
  const StepHandle c0 = BeginStep(*replicated, 1, 0);
  const StepHandle c1 = BeginStep(*replicated, 1, 1);
  // Trainer 1's "w" waits for trainer 0's; the sum is complete once both are in.
  ASSERT_THAT(SendGradient(*replicated, c1, 0, 0, from[1][0]), IsOk());
  ASSERT_THAT(SendGradient(*replicated, c0, 0, 0, from[0][0]), IsOk());
  EXPECT_TRUE(Eventually([&] { return stats_calls() == before + 1; }));
  for (int t = 0; t < 2; ++t) {
    ASSERT_THAT(SendGradient(*replicated, t == 0 ? c0 : c1, 1, 0, from[t][1]), IsOk());
  }
  Outcome outcomes[2];
  ASSERT_THAT(replicated->Commit(c0, 9, outcomes[0].Callback()), IsOk());
  ASSERT_THAT(replicated->Commit(c1, 9, outcomes[1].Callback()), IsOk());
  // Both: a callback must not outlive its Outcome.
  for (Outcome& outcome : outcomes) ASSERT_THAT(outcome.Wait().status(), IsOk());
  EXPECT_EQ(stats_calls(), before + 2);

  const StepHandle s = BeginStep(*sharded, 1, 0);
  for (int p = 0; p < 2; ++p) ASSERT_THAT(SendGradient(*sharded, s, p, 0, mean[p]), IsOk());
  Outcome reference;
  ASSERT_THAT(sharded->Commit(s, 9, reference.Callback()), IsOk());
  ASSERT_THAT(reference.Wait().status(), IsOk());

  EXPECT_EQ(outcomes[0].result()->grad_norm, Norm(mean));
  EXPECT_EQ(outcomes[0].result()->grad_norm, reference.result()->grad_norm);
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(ParamValues(*replicated, p), ParamValues(*sharded, p)) << "param " << p;
  }
}

// Clipping AdamW's gradients takes no pass of its own over them: the coefficient goes into the
// update (math::AdamWArgs::grad_scale), with the bits of scaling the gradient first.
TEST_F(IngestStatisticsTest, AdamWIsClippedInItsUpdateWithoutAScalePass) {
  std::shared_ptr<Session> session =
      testutil::MakeSession(*engine_, Config(GradientMode::kSharded, 1));
  ASSERT_NE(session, nullptr);
  const int64_t scales = device_->faults().calls("Scale");
  const StepHandle c = BeginStep(*session, 1, 0);
  for (int p = 0; p < 2; ++p)
    ASSERT_THAT(SendGradient(*session, c, p, 0, Gradient(p, 4.0f)), IsOk());
  Outcome outcome;
  ASSERT_THAT(session->Commit(c, 9, outcome.Callback()), IsOk());
  ASSERT_THAT(outcome.Wait().status(), IsOk());
  EXPECT_TRUE(outcome.result()->clipped);
  EXPECT_EQ(device_->faults().calls("Scale"), scales);
}

}  // namespace
}  // namespace optstep
