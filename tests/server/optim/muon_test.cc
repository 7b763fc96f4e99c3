// Muon (spec §3.4, tests §9.1) on the device under test against the float64 reference and the
// exact identities of the EMA momentum.

#include "server/optim/muon.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/optim/muon_core.h"
#include "server/optim/sgd.h"
#include "tests/server/optim/optim_test_util.h"
#include "tests/server/optim/reference/matrix64.h"
#include "tests/server/optim/reference/muon64.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ref::Matrix;
using testutil::AllClose;
using testutil::StatusIs;
using testutil::StepHarness;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::unique_ptr<Muon> MakeMuon(const MuonConfig& config) {
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create("muon", config);
  EXPECT_TRUE(muon.ok()) << muon.status();
  return *std::move(muon);
}

char ModeLetter(WeightDecayMode mode) {
  switch (mode) {
    case WeightDecayMode::kDecoupled:
      return 'd';
    case WeightDecayMode::kIndependent:
      return 'i';
    case WeightDecayMode::kL2:
      return 'l';
    case WeightDecayMode::kPalm:
      return 'p';
  }
  return '?';
}

class MuonTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = testutil::TestDevice();
};

TEST(MuonScaleTest, ScaleFactorsAreTheFormulas) {
  for (auto [r, c] :
       {std::pair<int64_t, int64_t>{512, 512}, {512, 256}, {256, 512}, {97, 37}, {37, 97}}) {
    const double rd = static_cast<double>(r), cd = static_cast<double>(c);
    EXPECT_EQ(MuonScaleFactor(ScaleMode::kSpectral, r, c), std::sqrt(std::max(rd, cd)));
    EXPECT_EQ(MuonScaleFactor(ScaleMode::kShapeScaling, r, c), std::sqrt(std::max(1.0, rd / cd)));
    EXPECT_EQ(MuonScaleFactor(ScaleMode::kUnitRmsNorm, r, c), std::sqrt(rd / cd));
  }
  EXPECT_NEAR(MuonScaleFactor(ScaleMode::kSpectral, 2048, 512), 45.254834, 1e-6);
  EXPECT_EQ(MuonScaleFactor(ScaleMode::kShapeScaling, 2048, 512), 2.0);
  EXPECT_EQ(MuonScaleFactor(ScaleMode::kShapeScaling, 512, 2048), 1.0);
  EXPECT_EQ(MuonScaleFactor(ScaleMode::kUnitRmsNorm, 2048, 512), 2.0);
  EXPECT_EQ(MuonScaleFactor(ScaleMode::kUnitRmsNorm, 512, 2048), 0.5);
}

// spec §3.4.2: with the identity as orthogonalization, Muon (η, μ) is SGD (η·(1−μ), μ).
TEST_F(MuonTest, WithoutOrthogonalizationTheEmaMomentumIsSgd) {
  MuonConfig config;
  config.orthogonalize = false;
  config.momentum = 0.5;
  auto muon = MakeMuon(config);
  SgdConfig sgd_config;
  sgd_config.momentum = 0.5;
  auto sgd = *Sgd::Create("sgd", sgd_config);
  const ParamInfo info{"w", {6, 5}};
  const std::vector<float> p0 = testutil::Integers(30, -8, 8, 1);
  StepHarness a(*device_, *muon, info, p0);
  StepHarness b(*device_, *sgd, info, p0);
  for (int t = 1; t <= 5; ++t) {
    const std::vector<float> g = testutil::Integers(30, -4, 4, 10 + t);
    a.Step(g, 2.0, 0.0, t);
    b.Step(g, 1.0, 0.0, t);
    ASSERT_EQ(a.param(), b.param()) << "step " << t;
  }
}

TEST_F(MuonTest, DecayModesOnIntegerData) {
  const ParamInfo info{"w", {4, 3}};
  const std::vector<float> p0 = testutil::Integers(12, -8, 8, 2);
  const std::vector<float> g = testutil::Integers(12, -4, 4, 3);
  // Decoupled decay with μ = 0 is SGD's coupled decay: η = 2, λ = 0.5.
  MuonConfig config;
  config.orthogonalize = false;
  config.momentum = 0.0;
  auto muon = MakeMuon(config);
  SgdConfig sgd_config;
  auto sgd = *Sgd::Create("sgd", sgd_config);
  StepHarness a(*device_, *muon, info, p0);
  StepHarness b(*device_, *sgd, info, p0);
  a.Step(g, 2.0, 0.5, 1);
  b.Step(g, 2.0, 0.5, 1);
  EXPECT_EQ(a.param(), b.param());
  // Independent decay: η = 0, λ = 0.25 ⇒ p ← 0.75·p.
  config.weight_decay_mode = WeightDecayMode::kIndependent;
  auto independent = MakeMuon(config);
  StepHarness c(*device_, *independent, info, p0);
  c.Step(g, 0.0, 0.25, 1);
  std::vector<float> want = p0;
  for (float& x : want) x *= 0.75f;
  EXPECT_EQ(c.param(), want);
}

TEST_F(MuonTest, NesterovFirstStepEqualsThePlainOne) {
  const ParamInfo info{"w", {24, 16}};
  const std::vector<float> p0 = testutil::Normal(24 * 16, 1.0, 4);
  const std::vector<float> g = testutil::Normal(24 * 16, 0.1, 5);
  MuonConfig config;
  config.fp32_matmul_prec = "highest";
  auto plain = MakeMuon(config);
  config.nesterov = true;
  auto nesterov = MakeMuon(config);
  StepHarness a(*device_, *plain, info, p0);
  StepHarness b(*device_, *nesterov, info, p0);
  a.Step(g, 0.01, 0.1, 1);
  b.Step(g, 0.01, 0.1, 1);
  EXPECT_TRUE(AllClose(a.param(), b.param_matrix(), 0.0, 1e-6));
}

struct FullCase {
  std::string scale_mode;
  double kappa;
  bool nesterov;
  WeightDecayMode mode;
};

TEST_F(MuonTest, FourStepsMatchTheFloat64ReferenceForEveryOption) {
  std::vector<FullCase> cases;
  for (const char* scale : {"spectral", "shape_scaling", "unit_rms_norm"}) {
    for (double kappa : {1.0, 0.2}) {
      for (bool nesterov : {false, true}) {
        for (WeightDecayMode mode : {WeightDecayMode::kDecoupled, WeightDecayMode::kIndependent,
                                     WeightDecayMode::kL2, WeightDecayMode::kPalm}) {
          cases.push_back({scale, kappa, nesterov, mode});
        }
      }
    }
  }
  for (const FullCase& c : cases) {
    for (const Shape& shape : {Shape{20, 36}, Shape{36, 20}}) {
      SCOPED_TRACE(::testing::Message()
                   << c.scale_mode << " kappa " << c.kappa << " nesterov " << c.nesterov << " mode "
                   << ModeLetter(c.mode) << " " << ShapeString(shape));
      MuonConfig config;
      config.fp32_matmul_prec = "highest";
      config.scale_mode = c.scale_mode;
      config.extra_scale_factor = c.kappa;
      config.nesterov = c.nesterov;
      config.weight_decay_mode = c.mode;
      config.momentum = 0.9;
      auto muon = MakeMuon(config);
      ref::MuonSpec spec;
      spec.momentum = 0.9;
      spec.nesterov = c.nesterov;
      spec.decay_mode = ModeLetter(c.mode);
      spec.scale_mode = c.scale_mode;
      spec.kappa = c.kappa;
      ref::Muon64 reference(spec, shape[0], shape[1]);
      const int64_t n = shape[0] * shape[1];
      const std::vector<float> p0 = testutil::Normal(n, 1.0, 6);
      StepHarness h(*device_, *muon, {"w", shape}, p0);
      Matrix p = Matrix::FromFloats(shape[0], shape[1], p0);
      for (int t = 1; t <= 4; ++t) {
        const std::vector<float> g = testutil::Normal(n, 0.1, 20 + t);
        const double lr = 0.02 / t;
        h.Step(g, lr, 0.1, t);
        reference.Step(Matrix::FromFloats(shape[0], shape[1], g), lr, 0.1, p);
      }
      EXPECT_TRUE(AllClose(h.param(), p, 1e-5, 1e-5));
      EXPECT_TRUE(AllClose(h.state("momentum_buffer"), reference.momentum(), 1e-5, 1e-6));
    }
  }
}

TEST_F(MuonTest, EveryCoefficientTableMatchesTheReference) {
  const Shape shape = {28, 20};
  for (const char* table : {"simple", "quintic", "polar_express", "aol", "custom"}) {
    SCOPED_TRACE(table);
    MuonConfig config;
    config.fp32_matmul_prec = "highest";
    config.coefficient_type = table;
    config.num_ns_steps = 6;
    ref::MuonSpec spec;
    spec.steps = 6;
    if (std::string(table) == "custom") {
      config.custom_coefficients = {3.0, -3.2, 1.2, 2.0, -1.5, 0.5};
      spec.table = {{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}};
    } else {
      spec.table = ref::SpecTable(table);
      spec.repeat_last = std::string(table) == "polar_express";
    }
    auto muon = MakeMuon(config);
    ref::Muon64 reference(spec, shape[0], shape[1]);
    const std::vector<float> p0 = testutil::Normal(560, 1.0, 7);
    StepHarness h(*device_, *muon, {"w", shape}, p0);
    Matrix p = Matrix::FromFloats(shape[0], shape[1], p0);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = testutil::Normal(560, 0.1, 30 + t);
      h.Step(g, 0.01, 0.1, t);
      reference.Step(Matrix::FromFloats(shape[0], shape[1], g), 0.01, 0.1, p);
    }
    EXPECT_TRUE(AllClose(h.param(), p, 1e-5, 1e-5));
  }
}

TEST_F(MuonTest, MediumPrecisionStaysWithinTheSpecTolerance) {
  const Shape shape = {48, 80};
  MuonConfig config;  // fp32_matmul_prec "medium" by default
  auto muon = MakeMuon(config);
  ref::Muon64 reference(ref::MuonSpec{}, shape[0], shape[1]);
  const std::vector<float> p0 = testutil::Normal(48 * 80, 1.0, 8);
  StepHarness h(*device_, *muon, {"w", shape}, p0);
  Matrix p = Matrix::FromFloats(shape[0], shape[1], p0);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float> g = testutil::Normal(48 * 80, 0.1, 40 + t);
    h.Step(g, 0.01, 0.0, t);
    reference.Step(Matrix::FromFloats(shape[0], shape[1], g), 0.01, 0.0, p);
  }
  // The update p − p0, relative Frobenius error (spec §9.1: 3e-2 for medium).
  const Matrix start = Matrix::FromFloats(shape[0], shape[1], p0);
  const Matrix want = ref::Combine(1.0, p, -1.0, start);
  const Matrix got = ref::Combine(1.0, h.param_matrix(), -1.0, start);
  EXPECT_LE(testutil::RelativeError(got.ToFloats(), want), 3e-2);
  EXPECT_GT(testutil::RelativeError(got.ToFloats(), want), 1e-5);  // it is not fp32
}

TEST_F(MuonTest, SplitQkvOrthogonalizesEachComponentOverAllGroups) {
  // 2 query groups of [2 query heads | 1 key | 1 value] × head_dim 4 = 32 rows.
  ParamInfo info{"layers.0.attention.linear_qkv.weight", {32, 24}};
  info.qkv = {2, 2, 4};
  const std::vector<float> g = testutil::Normal(32 * 24, 1.0, 9);
  auto run = [&](bool split) {
    MuonConfig config;
    config.fp32_matmul_prec = "highest";
    config.momentum = 0.0;
    config.split_qkv = split;
    auto muon = MakeMuon(config);
    StepHarness h(*device_, *muon, info, std::vector<float>(32 * 24, 0.0f));
    h.Step(g, 1.0, 0.0, 1);  // p = −O
    Matrix o = h.param_matrix();
    for (double& x : o.v) x = -x;
    return o;
  };
  ref::MuonSpec spec;
  spec.momentum = 0.0;
  spec.q_rows = 8;
  spec.kv_rows = 4;
  ref::Muon64 reference(spec, 32, 24);
  Matrix zero(32, 24);
  const Matrix want = reference.Orthogonalized(Matrix::FromFloats(32, 24, g), 1.0, 0.0, zero);
  const Matrix split = run(true);
  EXPECT_TRUE(AllClose(split, want, 1e-5, 1e-5));
  EXPECT_GT(ref::MaxAbsDiff(split, run(false)), 1e-2);
}

TEST_F(MuonTest, SplitQkvAndHighPrecisionOverThreeSteps) {
  ParamInfo info{"layers.0.attention.linear_qkv.weight", {48, 20}};
  info.qkv = {2, 4, 4};  // 2 groups of [4 query heads | 1 key | 1 value] × head_dim 4
  for (const char* precision : {"highest", "high"}) {
    SCOPED_TRACE(precision);
    MuonConfig config;
    config.fp32_matmul_prec = precision;
    config.nesterov = true;
    config.scale_mode = "unit_rms_norm";
    auto muon = MakeMuon(config);
    ref::MuonSpec spec;
    spec.nesterov = true;
    spec.scale_mode = "unit_rms_norm";
    spec.q_rows = 16;
    spec.kv_rows = 4;
    ref::Muon64 reference(spec, 48, 20);
    const std::vector<float> p0 = testutil::Normal(48 * 20, 1.0, 13);
    StepHarness h(*device_, *muon, info, p0);
    Matrix p = Matrix::FromFloats(48, 20, p0);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = testutil::Normal(48 * 20, 0.1, 50 + t);
      h.Step(g, 0.01, 0.1, t);
      reference.Step(Matrix::FromFloats(48, 20, g), 0.01, 0.1, p);
    }
    // "high" is TF32 on a GPU (10-bit mantissa products), fp32 on the CPU.
    const bool tf32 = std::string(precision) == "high" && device_->name() != "cpu";
    const double tolerance = tf32 ? 1e-4 : 1e-5;
    EXPECT_TRUE(AllClose(h.param(), p, tolerance, tolerance));
  }
}

TEST_F(MuonTest, StateAndValidation) {
  MuonConfig config;
  auto muon = MakeMuon(config);
  EXPECT_EQ(muon->kind(), "muon");
  EXPECT_EQ(muon->default_lr(), 3e-4);
  EXPECT_EQ(muon->default_weight_decay(), 0.01);
  ParamState state;
  ASSERT_THAT(muon->InitState(*device_, {"w", {5, 7}}, state), testutil::IsOk());
  ASSERT_EQ(state.tensors.size(), 1u);
  EXPECT_EQ(state.tensors[0].first, "momentum_buffer");
  EXPECT_EQ(state.tensors[0].second.shape(), (Shape{5, 7}));
  EXPECT_THAT(muon->CheckParam({"ln.weight", {16}}),
              StatusIs(kInvalid, "param 'ln.weight': muon needs a 2-D parameter, got shape [16]"));
  EXPECT_THAT(muon->CheckParam({"conv", {2, 3, 4}}), StatusIs(kInvalid, "param 'conv'"));
  ParamInfo qkv{"qkv", {30, 8}};
  qkv.qkv = {1, 2, 4};  // 16 rows per group
  EXPECT_THAT(muon->CheckParam(qkv), StatusIs(kInvalid, "param 'qkv': qkv split of 16 rows"));

  struct Bad {
    std::function<void(MuonConfig&)> change;
    const char* message;
  };
  const Bad bad[] = {
      {[](MuonConfig& c) { c.num_ns_steps = 0; }, "muon: num_ns_steps = 0 must be >= 1"},
      {[](MuonConfig& c) { c.coefficient_type = "cubic"; }, "coefficient_type 'cubic'"},
      {[](MuonConfig& c) { c.coefficient_type = "custom"; }, "needs a non-empty list"},
      {[](MuonConfig& c) {
         c.coefficient_type = "custom";
         c.custom_coefficients = {1, 2};
       },
       "got 2 custom_coefficients"},
      {[](MuonConfig& c) {
         c.custom_coefficients = {1, 2, 3};
       },
       "not 'custom'"},
      {[](MuonConfig& c) { c.scale_mode = "rms"; }, "scale_mode 'rms'"},
      {[](MuonConfig& c) { c.fp32_matmul_prec = "low"; },
       "fp32_matmul_prec: matmul precision 'low' is not one of highest, high, medium"},
      {[](MuonConfig& c) { c.momentum = 1.0; }, "momentum = 1 must be in [0, 1)"},
      {[](MuonConfig& c) { c.lr = -1.0; }, "lr = -1"},
      {[](MuonConfig& c) { c.weight_decay = -1.0; }, "weight_decay = -1"},
      {[](MuonConfig& c) { c.ns_eps = 0.0; }, "ns_eps = 0"},
      {[](MuonConfig& c) { c.extra_scale_factor = NAN; }, "extra_scale_factor"},
      // Bounds on the work of one step and the size of one update (spec §3, "Bounds checked at
      // creation").
      {[](MuonConfig& c) { c.num_ns_steps = 101; }, "muon: num_ns_steps = 101 must be <= 100"},
      {[](MuonConfig& c) {
         c.coefficient_type = "polar_express";
         c.num_ns_steps = 100000000;
       },
       "num_ns_steps = 100000000 must be <= 100"},
      {[](MuonConfig& c) {
         c.coefficient_type = "custom";
         c.custom_coefficients.assign(3 * 101, 1.0);
       },
       "rows of custom_coefficients = 101 must be <= 100"},
      {[](MuonConfig& c) { c.lr = 1e30; }, "lr = 1e+30 must be <= 1000"},
      {[](MuonConfig& c) { c.weight_decay = INFINITY; }, "weight_decay = inf must be finite"},
      {[](MuonConfig& c) { c.ns_eps = 2.0; }, "ns_eps = 2 must be <= 1"},
      {[](MuonConfig& c) { c.extra_scale_factor = 1e4; }, "extra_scale_factor = 10000 must be <="},
  };
  for (const Bad& b : bad) {
    MuonConfig c;
    b.change(c);
    EXPECT_THAT(Muon::Create("muon", c).status(), StatusIs(kInvalid, b.message)) << b.message;
  }
  config.coefficient_type = "aol";  // valid, with a logged warning (spec §8.2 #1)
  EXPECT_THAT(Muon::Create("muon", config).status(), testutil::IsOk());
}

TEST(MuonCostTest, CostFollowsNewtonSchulzFlops) {
  auto muon = MakeMuon(MuonConfig{});
  // spec §6: equal numel, k·(4·r²·c + 2·r³) flops: 5.8× the Newton–Schulz work (4× in c·r²).
  const double square = muon->EstimateStepCost({"a", {4096, 4096}});
  const double wide = muon->EstimateStepCost({"b", {1024, 16384}});
  const double r = 1024, c = 16384;
  EXPECT_NEAR(wide, 36.0 * r * c + 5 * (4 * r * r * c + 2 * r * r * r) / 10.0, 1.0);
  EXPECT_GT(square / wide, 5.0);
  EXPECT_NEAR(square, 36.0 * 4096 * 4096 + 5 * 6.0 * std::pow(4096.0, 3) / 10.0, 1.0);
  ParamInfo qkv{"qkv", {96, 32}};
  qkv.qkv = {2, 2, 16};
  EXPECT_LT(muon->EstimateStepCost(qkv), muon->EstimateStepCost({"dense", {96, 32}}) * 1.5);
}

}  // namespace
}  // namespace optstep
