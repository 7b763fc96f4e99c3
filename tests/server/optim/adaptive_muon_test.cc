// AdaptiveMuon (spec §3.5, tests §9.2) on the device under test against the float64 reference.

#include "server/optim/adaptive_muon.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

std::unique_ptr<AdaptiveMuon> Make(const std::string& method, bool nesterov = false,
                                   double kappa = 1.0) {
  AdaptiveMuonConfig config;
  config.moment2_method = method;
  config.muon.fp32_matmul_prec = "highest";
  config.muon.nesterov = nesterov;
  config.muon.extra_scale_factor = kappa;
  absl::StatusOr<std::unique_ptr<AdaptiveMuon>> made = AdaptiveMuon::Create("am", config);
  EXPECT_TRUE(made.ok()) << made.status();
  return *std::move(made);
}

// Elements whose reference O is at rounding level in any step: an element-wise normalization
// maps them to ±1/√(1−β2) with an arbitrary sign (spec §9.2), so they are not compared.
std::vector<bool> Comparable(const ref::MuonSpec& spec, const Shape& shape,
                             const std::vector<std::vector<float>>& grads) {
  ref::Muon64 muon(spec, shape[0], shape[1]);
  Matrix p(shape[0], shape[1]);
  std::vector<bool> keep(shape[0] * shape[1], true);
  for (const auto& g : grads) {
    const Matrix o = muon.Orthogonalized(Matrix::FromFloats(shape[0], shape[1], g), 0.0, 0.0, p);
    const double limit = 1e-4 * ref::MaxAbs(o);
    for (size_t i = 0; i < keep.size(); ++i) keep[i] = keep[i] && std::fabs(o.v[i]) > limit;
  }
  return keep;
}

class AdaptiveMuonTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = testutil::TestDevice();
};

TEST_F(AdaptiveMuonTest, MomentShapes) {
  auto adamuon = Make("adamuon");
  auto normuon = Make("normuon");
  const std::pair<Shape, Shape> cases[] = {
      {{16, 8}, {16, 1}}, {{8, 16}, {1, 16}}, {{12, 12}, {12, 1}}};
  for (const auto& [shape, moment] : cases) {
    ParamState a, n;
    ASSERT_THAT(adamuon->InitState(*device_, {"w", shape}, a), testutil::IsOk());
    ASSERT_THAT(normuon->InitState(*device_, {"w", shape}, n), testutil::IsOk());
    EXPECT_EQ(a.Find("moment2_buffer")->shape(), shape);
    EXPECT_EQ(n.Find("moment2_buffer")->shape(), moment);
    EXPECT_NE(n.Find("momentum_buffer"), nullptr);
  }
}

TEST_F(AdaptiveMuonTest, FirstStepFromZeroState) {
  const double beta2 = 0.95;
  for (const Shape& shape : {Shape{24, 16}, Shape{16, 24}}) {
    SCOPED_TRACE(ShapeString(shape));
    const int64_t n = shape[0] * shape[1];
    const std::vector<float> g = testutil::Normal(n, 1.0, 1);
    ref::MuonSpec spec;
    ref::Muon64 muon(spec, shape[0], shape[1]);
    Matrix zero(shape[0], shape[1]);
    const Matrix o = muon.Orthogonalized(Matrix::FromFloats(shape[0], shape[1], g), 1.0, 0.0, zero);
    // adamuon: |d| = |O|/(√(1−β2)·|O| + ε) where O is not at rounding level.
    {
      auto opt = Make("adamuon");
      StepHarness h(*device_, *opt, {"w", shape}, std::vector<float>(n, 0.0f));
      h.Step(g, 1.0, 0.0, 1);
      const std::vector<float> d = h.param();  // −d
      const double limit = 1e-4 * ref::MaxAbs(o);
      for (int64_t i = 0; i < n; ++i) {
        if (std::fabs(o.v[i]) <= limit) continue;
        const double a = std::fabs(o.v[i]);
        EXPECT_NEAR(std::fabs(d[i]), a / (std::sqrt(1 - beta2) * a + 1e-8), 1e-6 * 4.5) << i;
      }
    }
    // normuon: every row (m ≥ n) or column has rms(d) = 1/√(1−β2).
    {
      auto opt = Make("normuon");
      StepHarness h(*device_, *opt, {"w", shape}, std::vector<float>(n, 0.0f));
      h.Step(g, 1.0, 0.0, 1);
      const Matrix d = h.param_matrix();
      const bool per_row = shape[0] >= shape[1];
      for (int64_t k = 0; k < (per_row ? shape[0] : shape[1]); ++k) {
        double sum = 0.0;
        const int64_t count = per_row ? shape[1] : shape[0];
        for (int64_t j = 0; j < count; ++j) {
          const double x = per_row ? d(k, j) : d(j, k);
          sum += x * x;
        }
        EXPECT_NEAR(std::sqrt(sum / count), 1.0 / std::sqrt(1 - beta2), 1e-6 * 4.5) << k;
      }
    }
  }
}

TEST_F(AdaptiveMuonTest, ThreeStepsMatchTheFloat64Reference) {
  for (bool normuon : {false, true}) {
    for (bool nesterov : {false, true}) {
      for (const Shape& shape : {Shape{20, 28}, Shape{28, 20}}) {
        SCOPED_TRACE(::testing::Message() << (normuon ? "normuon" : "adamuon") << " nesterov "
                                          << nesterov << " " << ShapeString(shape));
        const int64_t n = shape[0] * shape[1];
        auto opt = Make(normuon ? "normuon" : "adamuon", nesterov);
        ref::MuonSpec spec;
        spec.nesterov = nesterov;
        ref::AdaptiveMuon64 reference(spec, shape[0], shape[1], normuon, 0.95, 1e-8);
        const std::vector<float> p0 = testutil::Normal(n, 1.0, 2);
        std::vector<std::vector<float>> grads;
        for (int t = 1; t <= 3; ++t) grads.push_back(testutil::Normal(n, 0.1, 10 + t));
        StepHarness h(*device_, *opt, {"w", shape}, p0);
        Matrix p = Matrix::FromFloats(shape[0], shape[1], p0);
        for (int t = 1; t <= 3; ++t) {
          h.Step(grads[t - 1], 0.01, 0.1, t);
          reference.Step(Matrix::FromFloats(shape[0], shape[1], grads[t - 1]), 0.01, 0.1, p);
        }
        const std::vector<bool> keep = Comparable(spec, shape, grads);
        std::vector<float> got = h.param();
        for (int64_t i = 0; i < n; ++i) {
          if (!keep[i]) got[i] = static_cast<float>(p.v[i]);
        }
        EXPECT_TRUE(AllClose(got, p, 1e-5, 1e-5));
        EXPECT_TRUE(AllClose(h.state("moment2_buffer"), reference.moment(), 1e-5, 1e-5));
      }
    }
  }
}

TEST_F(AdaptiveMuonTest, TheMuonScaleCancelsOut) {
  const Shape shape = {24, 32};
  const int64_t n = 24 * 32;
  const std::vector<float> p0 = testutil::Normal(n, 1.0, 3);
  for (const char* method : {"adamuon", "normuon"}) {
    SCOPED_TRACE(method);
    auto one = Make(method, false, 1.0);
    auto fifth = Make(method, false, 0.2);
    StepHarness a(*device_, *one, {"w", shape}, p0);
    StepHarness b(*device_, *fifth, {"w", shape}, p0);
    std::vector<std::vector<float>> grads;
    for (int t = 1; t <= 3; ++t) {
      grads.push_back(testutil::Normal(n, 0.1, 20 + t));
      a.Step(grads.back(), 0.01, 0.0, t);
      b.Step(grads.back(), 0.01, 0.0, t);
    }
    const std::vector<bool> keep = Comparable(ref::MuonSpec{}, shape, grads);
    std::vector<float> got = b.param();
    const Matrix want = a.param_matrix();
    for (int64_t i = 0; i < n; ++i) {
      if (!keep[i]) got[i] = static_cast<float>(want.v[i]);
    }
    EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5));
  }
}

TEST_F(AdaptiveMuonTest, Validation) {
  AdaptiveMuonConfig config;
  config.moment2_method = "namo";
  EXPECT_THAT(AdaptiveMuon::Create("am", config).status(),
              StatusIs(kInvalid, "am: moment2_method 'namo' is not one of adamuon, normuon"));
  config.moment2_method = "normuon";
  config.beta2 = 1.0;
  EXPECT_THAT(AdaptiveMuon::Create("am", config).status(), StatusIs(kInvalid, "beta2 = 1"));
  config.beta2 = 0.95;
  config.eps = -1;
  EXPECT_THAT(AdaptiveMuon::Create("am", config).status(), StatusIs(kInvalid, "eps = -1"));
  config.eps = 1e-8;
  config.muon.num_ns_steps = 0;
  EXPECT_THAT(AdaptiveMuon::Create("am", config).status(), StatusIs(kInvalid, "num_ns_steps"));
  auto opt = Make("normuon");
  EXPECT_EQ(opt->kind(), "adaptive_muon");
  EXPECT_THAT(opt->CheckParam({"b", {8}}),
              StatusIs(kInvalid, "param 'b': adaptive_muon needs a 2-D parameter"));
  EXPECT_GT(opt->EstimateStepCost({"w", {64, 64}}),
            Make("adamuon")->EstimateStepCost({"w", {8, 8}}));
}

}  // namespace
}  // namespace optstep
