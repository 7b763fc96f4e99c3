// Lion (spec §3.3, tests §9.3): exact single-step properties on integer data and a float64
// reference over several steps, on the device under test.

#include "server/optim/lion.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/optim/optim_test_util.h"
#include "tests/server/optim/reference/matrix64.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ref::Matrix;
using testutil::AllClose;
using testutil::StatusIs;
using testutil::StepHarness;

std::unique_ptr<Lion> MakeLion(double beta1, double beta2, WeightDecayMode mode) {
  LionConfig config;
  config.beta1 = beta1;
  config.beta2 = beta2;
  config.weight_decay_mode = mode;
  absl::StatusOr<std::unique_ptr<Lion>> lion = Lion::Create("lion", config);
  EXPECT_TRUE(lion.ok()) << lion.status();
  return *std::move(lion);
}

class LionTest : public ::testing::Test {
 protected:
  // One step from zero state on parameters in [1, 5).
  std::vector<float> OneStep(WeightDecayMode mode, double lr, double lambda,
                             const std::vector<float>& p0, const std::vector<float>& g,
                             double beta2 = 0.99, std::vector<float>* exp_avg = nullptr) {
    auto lion = MakeLion(0.9, beta2, mode);
    StepHarness h(*device_, *lion, {"w", {static_cast<int64_t>(p0.size())}}, p0);
    h.Step(g, lr, lambda, 1);
    if (exp_avg != nullptr) *exp_avg = h.state("exp_avg");
    return h.param();
  }

  std::unique_ptr<Device> device_ = testutil::TestDevice();
  const std::vector<float> p0_ = testutil::Integers(257, 1, 4, 1);
  const std::vector<float> zero_ = std::vector<float>(257, 0.0f);
};

TEST_F(LionTest, ExactStepProperties) {
  const std::vector<float> g = testutil::Integers(257, -6, 6, 2);
  // β2 = 0.75: exp_avg = 0.25·g exactly.
  std::vector<float> m;
  OneStep(WeightDecayMode::kDecoupled, 0.25, 0.0, p0_, g, 0.75, &m);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(m[i], 0.25f * g[i]);
  // λ = 0: |Δp| = η where g ≠ 0, and p unchanged where g = 0.
  const std::vector<float> p = OneStep(WeightDecayMode::kDecoupled, 0.25, 0.0, p0_, g);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(std::fabs(p[i] - p0_[i]), g[i] == 0.0f ? 0.0f : 0.25f) << i;
  }
  auto each = [&](const std::vector<float>& got, auto want) {
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want(p0_[i])) << i;
  };
  // Decoupled, zero g: p·(1 − ηλ).
  each(OneStep(WeightDecayMode::kDecoupled, 0.25, 0.5, p0_, zero_),
       [](float x) { return x * 0.875f; });
  // L2, zero g: the sign of λ·p is +1.
  each(OneStep(WeightDecayMode::kL2, 0.25, 0.5, p0_, zero_), [](float x) { return x - 0.25f; });
  // L2 with λ = 0.125 and g ∈ [−10, −5): the gradient dominates the sign.
  each(OneStep(WeightDecayMode::kL2, 0.25, 0.125, p0_, testutil::Integers(257, -10, -6, 3)),
       [](float x) { return x + 0.25f; });
  // Independent, zero g: p·(1 − λ).
  each(OneStep(WeightDecayMode::kIndependent, 0.25, 0.5, p0_, zero_),
       [](float x) { return x * 0.5f; });
  // palm, zero g: p·(1 − λ·η²).
  each(OneStep(WeightDecayMode::kPalm, 0.5, 0.5, p0_, zero_), [](float x) { return x * 0.875f; });
}

TEST_F(LionTest, ThreeStepsMatchTheFloat64Reference) {
  const int64_t n = 4099;
  for (WeightDecayMode mode : {WeightDecayMode::kDecoupled, WeightDecayMode::kIndependent,
                               WeightDecayMode::kL2, WeightDecayMode::kPalm}) {
    SCOPED_TRACE(static_cast<int>(mode));
    auto lion = MakeLion(0.9, 0.99, mode);
    const std::vector<float> p0 = testutil::Normal(n, 1.0, 4);
    StepHarness h(*device_, *lion, {"w", {n}}, p0);
    Matrix p = Matrix::FromFloats(1, n, p0), m(1, n);
    const double lambda = 0.1;
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = testutil::Normal(n, 1.0, 10 + t);
      const double lr = 1e-3 * t;
      h.Step(g, lr, lambda, t);
      for (int64_t i = 0; i < n; ++i) {
        double gi = g[i];
        if (mode == WeightDecayMode::kL2) gi += lambda * p.v[i];
        if (mode == WeightDecayMode::kDecoupled) p.v[i] -= lr * lambda * p.v[i];
        if (mode == WeightDecayMode::kIndependent) p.v[i] -= lambda * p.v[i];
        if (mode == WeightDecayMode::kPalm) p.v[i] -= lambda * lr * lr * p.v[i];
        const double c = 0.9 * m.v[i] + 0.1 * gi;
        m.v[i] = 0.99 * m.v[i] + 0.01 * gi;
        p.v[i] -= lr * ((c > 0) - (c < 0));
      }
    }
    EXPECT_TRUE(AllClose(h.state("exp_avg"), m, 1e-6, 1e-6));
    EXPECT_TRUE(AllClose(h.param(), p, 1e-6, 1e-6));
  }
}

TEST(LionValidationTest, RefusesOutOfRangeHyperparameters) {
  LionConfig c;
  c.lr = -1;
  EXPECT_THAT(Lion::Create("lion", c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "lion: lr = -1"));
  c = LionConfig{};
  c.beta1 = 1.0;
  EXPECT_THAT(Lion::Create("lion", c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "beta1 = 1 must be in [0, 1)"));
  c = LionConfig{};
  c.beta2 = -0.1;
  EXPECT_THAT(Lion::Create("lion", c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "beta2 = -0.1"));
  c = LionConfig{};
  c.weight_decay = -0.5;
  EXPECT_THAT(Lion::Create("lion", c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "weight_decay = -0.5"));
  c = LionConfig{};
  c.weight_decay_mode = static_cast<WeightDecayMode>(9);
  EXPECT_THAT(Lion::Create("lion", c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "weight_decay_mode 9"));
  auto lion = *Lion::Create("lion", LionConfig{});
  EXPECT_EQ(lion->EstimateStepCost({"w", {10, 10}}), 2000.0);
  EXPECT_EQ(lion->default_lr(), 1e-4);
}

}  // namespace
}  // namespace optstep
