// Device conformance, part 2: the optimizer updates (docs/spec/optimizers.md §3.1, §3.2, §9.4)
// against float64 plain-loop references written here, independently of kernels/math.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/tensor.h"
#include "tests/kernels/device_conformance.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

using ::optstep::testutil::StatusIs;
using ::testing::ElementsAreArray;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Adam/AdamW hyperparameters as the trainer gives them (float64, as in the configuration); the
// kernel receives them through math::MakeAdamWArgs, the reference uses them unrounded.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // effective λ = wd · wd_mult
  bool decoupled = true;
};

math::AdamWArgs KernelArgs(const AdamHyper& h, int t) {
  return math::MakeAdamWArgs(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled,
                             /*bias_correction=*/true, t);
}

struct AdamState64 {
  std::vector<double> p, m, v;
};

// spec §3.1, one step with counter value t, in float64.
void ReferenceAdamStep(const AdamHyper& h, int t, const std::vector<float>& grad, AdamState64& s) {
  const double b1 = h.beta1, b2 = h.beta2, eps = h.eps, lr = h.lr, wd = h.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  for (size_t i = 0; i < grad.size(); ++i) {
    double g = grad[i];
    if (!h.decoupled) g += wd * s.p[i];
    s.m[i] = b1 * s.m[i] + (1.0 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
    double d = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps);
    if (h.decoupled) d += wd * s.p[i];
    s.p[i] -= lr * d;
  }
}

// |got - want| <= atol + rtol·|want| for every element; reports the first violation.
::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<double>& want,
                                    double rtol, double atol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want "
                                           << want[i] << " (error " << err << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> Widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST_P(DeviceConformanceTest, AdamWTenStepsMatchFloat64Reference) {
  for (bool decoupled : {true, false}) {
    for (float wd_mult : {0.0f, 1.0f}) {
      for (int64_t n : ConformanceSizes()) {
        SCOPED_TRACE(::testing::Message()
                     << (decoupled ? "AdamW" : "L2") << " wd_mult " << wd_mult << " n " << n);
        AdamHyper h;
        h.decoupled = decoupled;
        h.weight_decay = 0.1 * wd_mult;
        const std::vector<float> p0 = Uniform(n, -1.0f, 1.0f, 100);
        AdamState64 ref{Widen(p0), std::vector<double>(n), std::vector<double>(n)};
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p, Upload(p0));
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m, device_->Allocate(DType::kF32, {n}));
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v, device_->Allocate(DType::kF32, {n}));
        for (int t = 1; t <= 10; ++t) {
          const std::vector<float> g = Normal(n, 1.0f, 200 + t);
          OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
          OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(h, t), tg, p, m, v));
          ReferenceAdamStep(h, t, g, ref);
        }
        OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_p, Download(p));
        OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_m, Download(m));
        OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_v, Download(v));
        EXPECT_TRUE(AllClose(got_p, ref.p, 1e-6, 1e-7)) << "param";
        EXPECT_TRUE(AllClose(got_m, ref.m, 1e-6, 1e-7)) << "exp_avg";
        EXPECT_TRUE(AllClose(got_v, ref.v, 1e-6, 1e-7)) << "exp_avg_sq";
      }
    }
  }
}

// spec §9.4: m0 = 1, v0 = 2, g = 0.5, betas (0.9, 0.99), eps 1e-8, counter 9 -> t = 10.
TEST_P(DeviceConformanceTest, AdamWSingleStepFromGivenState) {
  AdamHyper h;
  h.lr = 0.01;
  h.beta1 = 0.9;
  h.beta2 = 0.99;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p, Upload({1.5f}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m, Upload({1.0f}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v, Upload({2.0f}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor g, Upload({0.5f}));
  OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(h, 10), g, p, m, v));
  // The formula with the decimal constants of the spec.
  const double m1 = 0.9 * 1.0 + 0.1 * 0.5;     // 0.95
  const double v1 = 0.99 * 2.0 + 0.01 * 0.25;  // 1.9825
  const double d =
      (m1 / (1 - std::pow(0.9, 10))) / (std::sqrt(v1 / (1 - std::pow(0.99, 10))) + 1e-8);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_p, Download(p));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_m, Download(m));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_v, Download(v));
  EXPECT_NEAR(got_m[0], m1, 1e-6 * m1);
  EXPECT_NEAR(got_v[0], v1, 1e-6 * v1);
  EXPECT_NEAR(got_p[0], 1.5 - 0.01 * d, 1e-6 * 1.5);
}

// First step from zero state: m̂ = g, v̂ = g², so |Δp| = η·|g| / (|g| + ε).
TEST_P(DeviceConformanceTest, AdamWFirstStepFromZeroState) {
  AdamHyper h;
  h.lr = 0.125;
  const std::vector<float> g = {1.0f, -1.0f, 1e-3f, 1e-8f, -1e-8f, 3e-9f, 0.0f, 1e4f, -2.5e-7f};
  const int64_t n = static_cast<int64_t>(g.size());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p, device_->Allocate(DType::kF32, {n}));  // p0 = 0
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
  OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(h, 1), tg, p, m, v));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(p));
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(g[i]));
    const double want = 0.125 * a / (a + 1e-8);
    EXPECT_NEAR(std::fabs(got[i]), want, 1e-6 * want) << "g = " << g[i];
    EXPECT_TRUE(got[i] == 0.0f || std::signbit(got[i]) != std::signbit(g[i])) << "g = " << g[i];
  }
  // Decay alone (g = 0): decoupled p <- p - η·λ·p exactly; L2 p <- p - η·λp/(|λp| + ε).
  for (bool decoupled : {true, false}) {
    h.lr = 0.5;
    h.weight_decay = 0.5;
    h.decoupled = decoupled;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p2, Upload({2.0f, -4.0f}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m2, device_->Allocate(DType::kF32, {2}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v2, device_->Allocate(DType::kF32, {2}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor g2, device_->Allocate(DType::kF32, {2}));
    OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(h, 1), g2, p2, m2, v2));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got2, Download(p2));
    if (decoupled) {
      EXPECT_THAT(got2, ElementsAreArray({1.5f, -3.0f}));
    } else {
      EXPECT_NEAR(got2[0], 2.0 - 0.5 * 1.0 / (1.0 + 1e-8), 1e-6 * 1.5);
      EXPECT_NEAR(got2[1], -4.0 + 0.5 * 2.0 / (2.0 + 1e-8), 1e-6 * 3.5);
    }
  }
}

// spec §9.4: the fused decay and the two-stage form p·(1 − ηλ), then Adam, agree to 1e-6.
TEST_P(DeviceConformanceTest, AdamWFusedDecayMatchesTwoStage) {
  const int64_t n = 4097;
  AdamHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  const std::vector<float> p0 = Uniform(n, -2.0f, 2.0f, 31);
  const std::vector<float> g = Normal(n, 1.0f, 32);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor fused, Upload(p0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor two, Upload(p0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m1, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v1, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m2, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v2, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(h, 1), tg, fused, m1, v1));
  OPTSTEP_ASSERT_OK(device_->Scale(static_cast<float>(1.0 - h.lr * h.weight_decay), two));
  AdamHyper no_decay = h;
  no_decay.weight_decay = 0.0;
  OPTSTEP_ASSERT_OK(device_->updates().AdamW(KernelArgs(no_decay, 1), tg, two, m2, v2));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> a, Download(fused));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> b, Download(two));
  EXPECT_TRUE(AllClose(a, Widen(b), 1e-6, 1e-7));
}

// One source of truth: every device computes exactly the kernels/math formula, bit for bit.
TEST_P(DeviceConformanceTest, AdamWIsBitwiseTheSharedFormula) {
  const int64_t n = 65540;
  for (bool decoupled : {true, false}) {
    AdamHyper h;
    h.decoupled = decoupled;
    h.weight_decay = 0.05;
    std::vector<float> p = Uniform(n, -1.0f, 1.0f, 41), m = Normal(n, 0.1f, 42);
    std::vector<float> v = Uniform(n, 0.0f, 0.01f, 43);
    const std::vector<float> g = Normal(n, 1.0f, 44);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tm, Upload(m));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv, Upload(v));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
    const math::AdamWArgs args = KernelArgs(h, 3);
    OPTSTEP_ASSERT_OK(device_->updates().AdamW(args, tg, tp, tm, tv));
    for (int64_t i = 0; i < n; ++i) math::AdamWElement(args, g[i], p[i], m[i], v[i]);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(tp));
    ASSERT_EQ(std::memcmp(got.data(), p.data(), n * sizeof(float)), 0) << "decoupled " << decoupled;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(got, Download(tv));
    ASSERT_EQ(std::memcmp(got.data(), v.data(), n * sizeof(float)), 0);
  }
}

// A batch steps every tensor with the shared formula too, whatever sizes it mixes.
TEST_P(DeviceConformanceTest, AdamWBatchIsBitwiseTheSharedFormulaOnEachTensor) {
  AdamHyper h;
  h.weight_decay = 0.05;
  const math::AdamWArgs args = KernelArgs(h, 2);
  std::vector<std::vector<float>> p, m, v, g;
  std::vector<Tensor> tensors;  // g, p, m, v of each size, in order
  tensors.reserve(4 * ConformanceSizes().size());
  std::vector<AdamWOperands> batch;
  uint32_t seed = 50;
  for (int64_t n : ConformanceSizes()) {
    g.push_back(Normal(n, 1.0f, ++seed));
    p.push_back(Uniform(n, -1.0f, 1.0f, ++seed));
    m.push_back(Normal(n, 0.1f, ++seed));
    v.push_back(Uniform(n, 0.0f, 0.01f, ++seed));
    for (const std::vector<float>* x : {&g.back(), &p.back(), &m.back(), &v.back()}) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(*x));
      tensors.push_back(std::move(t));
    }
    Tensor* t = &tensors[tensors.size() - 4];
    batch.push_back({&t[0], &t[1], &t[2], &t[3]});
  }
  OPTSTEP_ASSERT_OK(device_->updates().AdamWBatch(args, batch));
  for (size_t k = 0; k < batch.size(); ++k) {
    for (size_t i = 0; i < p[k].size(); ++i) {
      math::AdamWElement(args, g[k][i], p[k][i], m[k][i], v[k][i]);
    }
    const size_t bytes = p[k].size() * sizeof(float);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(*batch[k].param));
    ASSERT_EQ(std::memcmp(got.data(), p[k].data(), bytes), 0) << "tensor " << k;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(got, Download(*batch[k].exp_avg));
    ASSERT_EQ(std::memcmp(got.data(), m[k].data(), bytes), 0) << "tensor " << k;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(got, Download(*batch[k].exp_avg_sq));
    ASSERT_EQ(std::memcmp(got.data(), v[k].data(), bytes), 0) << "tensor " << k;
  }
}

// Global clipping folded into the update (grad_scale) has the bits of scaling the gradient first
// (Device::Scale) and stepping with the scaled one, with the decay in the gradient (L2) too; the
// gradient itself is left as it was.
TEST_P(DeviceConformanceTest, AdamWGradScaleIsBitwiseScalingTheGradientFirst) {
  const int64_t n = 65540;
  const float scale = 0.3721f;
  for (bool decoupled : {true, false}) {
    AdamHyper h;
    h.decoupled = decoupled;
    h.weight_decay = 0.05;
    const std::vector<float> p = Uniform(n, -1.0f, 1.0f, 61), m = Normal(n, 0.1f, 62);
    const std::vector<float> v = Uniform(n, 0.0f, 0.01f, 63), g = Normal(n, 3.0f, 64);
    Tensor t[2][4];  // folded, scaled first: g, p, m, v
    for (Tensor* x : {t[0], t[1]}) {
      for (int k = 0; k < 4; ++k) {
        OPTSTEP_ASSERT_OK_AND_ASSIGN(x[k], Upload(k == 0 ? g : k == 1 ? p : k == 2 ? m : v));
      }
    }
    math::AdamWArgs folded = KernelArgs(h, 4);
    folded.grad_scale = scale;
    const std::vector<AdamWOperands> batch = {{&t[0][0], &t[0][1], &t[0][2], &t[0][3]}};
    OPTSTEP_ASSERT_OK(device_->updates().AdamWBatch(folded, batch));
    OPTSTEP_ASSERT_OK(device_->Scale(scale, t[1][0]));
    OPTSTEP_ASSERT_OK(
        device_->updates().AdamW(KernelArgs(h, 4), t[1][0], t[1][1], t[1][2], t[1][3]));
    for (int k = 1; k < 4; ++k) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(t[0][k]));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> want, Download(t[1][k]));
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
          << "tensor " << k << " decoupled " << decoupled;
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> grad, Download(t[0][0]));
    EXPECT_EQ(grad, g);
  }
}

// SGD and Lion take the clip coefficient into their update as AdamW does: the bits of scaling the
// gradient first and stepping with the scaled one (L2 decay, where the scaled gradient meets the
// decay, included), the gradient left as it was.
TEST_P(DeviceConformanceTest, SgdAndLionGradScaleIsBitwiseScalingTheGradientFirst) {
  const int64_t n = 65540;
  const float scale = 0.3721f;
  const std::vector<float> p = Uniform(n, -1.0f, 1.0f, 71), b = Normal(n, 0.1f, 72);
  const std::vector<float> g = Normal(n, 3.0f, 73);
  for (const char* op : {"sgd", "lion"}) {
    Tensor t[2][3];  // folded, scaled first: g, p, momentum buffer or exp_avg
    for (Tensor* x : {t[0], t[1]}) {
      for (int k = 0; k < 3; ++k) {
        OPTSTEP_ASSERT_OK_AND_ASSIGN(x[k], Upload(k == 0 ? g : k == 1 ? p : b));
      }
    }
    OPTSTEP_ASSERT_OK(device_->Scale(scale, t[1][0]));
    if (std::string(op) == "sgd") {
      math::SgdArgs a;
      a.lr = 0.01f;
      a.momentum = 0.9f;
      a.weight_decay = 0.05f;
      math::SgdArgs folded = a;
      folded.grad_scale = scale;
      OPTSTEP_ASSERT_OK(device_->updates().Sgd(folded, t[0][0], t[0][1], &t[0][2]));
      OPTSTEP_ASSERT_OK(device_->updates().Sgd(a, t[1][0], t[1][1], &t[1][2]));
      folded.grad_scale = 0.0f;
      EXPECT_THAT(device_->updates().Sgd(folded, t[0][0], t[0][1], &t[0][2]),
                  StatusIs(kInvalid, "Sgd: grad_scale"));
    } else {
      const math::LionArgs a =
          math::MakeLionArgs(1e-3, 0.9, 0.99, math::WeightDecayMode::kL2, 0.05);
      math::LionArgs folded = a;
      folded.grad_scale = scale;
      OPTSTEP_ASSERT_OK(device_->updates().Lion(folded, t[0][0], t[0][1], t[0][2]));
      OPTSTEP_ASSERT_OK(device_->updates().Lion(a, t[1][0], t[1][1], t[1][2]));
      folded.grad_scale = 1.5f;
      EXPECT_THAT(device_->updates().Lion(folded, t[0][0], t[0][1], t[0][2]),
                  StatusIs(kInvalid, "Lion: grad_scale"));
    }
    for (int k = 1; k < 3; ++k) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(t[0][k]));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> want, Download(t[1][k]));
      ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
          << op << " tensor " << k;
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> grad, Download(t[0][0]));
    EXPECT_EQ(grad, g) << op;
  }
}

TEST_P(DeviceConformanceTest, AdamWValidates) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor g, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor m, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v7, device_->Allocate(DType::kF32, {7}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h, device_->Allocate(DType::kBF16, {8}));
  math::AdamWArgs a;
  EXPECT_THAT(device_->updates().AdamW(a, g, p, m, v7),
              StatusIs(kInvalid, "AdamW: exp_avg_sq has 7 elements but grad has 8"));
  EXPECT_THAT(device_->updates().AdamW(a, h, p, m, v7), StatusIs(kInvalid, "AdamW: grad is bf16"));
  EXPECT_THAT(device_->updates().AdamW(a, g, p, p, m),
              StatusIs(kInvalid, "AdamW: param and exp_avg are the same tensor"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v, device_->Allocate(DType::kF32, {8}));
  math::AdamWArgs bad = a;
  bad.lr = -1.0f;
  EXPECT_THAT(device_->updates().AdamW(bad, g, p, m, v), StatusIs(kInvalid, "AdamW: lr must be"));
  bad = a;
  bad.beta1 = 1.0f;
  EXPECT_THAT(device_->updates().AdamW(bad, g, p, m, v),
              StatusIs(kInvalid, "beta1 must be in [0, 1), got 1"));
  bad = a;
  bad.bias_correction2 = 0.0f;
  EXPECT_THAT(device_->updates().AdamW(bad, g, p, m, v), StatusIs(kInvalid, "bias_correction2"));
  bad = a;
  bad.grad_scale = 0.0f;
  EXPECT_THAT(device_->updates().AdamW(bad, g, p, m, v), StatusIs(kInvalid, "grad_scale"));
  bad = a;
  bad.eps = std::nanf("");
  EXPECT_THAT(device_->updates().AdamW(bad, g, p, m, v), StatusIs(kInvalid, "eps"));
}

// SGD (spec §3.2) on integer data with μ = 0.5, η = 0.25: every value is a short dyadic
// fraction, so the reference is exact and the comparison is atol = rtol = 0.
TEST_P(DeviceConformanceTest, SgdExactOnIntegerData) {
  for (bool nesterov : {false, true}) {
    for (float wd : {0.0f, 0.5f}) {
      for (int64_t n : ConformanceSizes()) {
        SCOPED_TRACE(::testing::Message() << "nesterov " << nesterov << " wd " << wd << " n " << n);
        const double mu = 0.5, lr = 0.25;
        std::vector<float> p0 = Integers(n, -50, 50, 300);
        std::vector<double> p(p0.begin(), p0.end()), b(n);
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
        // A dirty buffer: the first step must overwrite it (b = d), not mix it in.
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, Upload(std::vector<float>(n, 999.0f)));
        for (int step = 0; step < 3; ++step) {
          const std::vector<float> g = Integers(n, -20, 20, 310 + step);
          OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
          math::SgdArgs args;
          args.lr = 0.25f;
          args.momentum = 0.5f;
          args.weight_decay = wd;
          args.nesterov = nesterov;
          args.first_step = step == 0;
          OPTSTEP_ASSERT_OK(device_->updates().Sgd(args, tg, tp, &tb));
          for (int64_t i = 0; i < n; ++i) {
            const double d = g[i] + wd * p[i];
            b[i] = step == 0 ? d : mu * b[i] + d;
            p[i] -= lr * (nesterov ? d + mu * b[i] : b[i]);
          }
          OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_p, Download(tp));
          OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_b, Download(tb));
          ASSERT_THAT(Widen(got_p), ElementsAreArray(p)) << "step " << step;
          ASSERT_THAT(Widen(got_b), ElementsAreArray(b)) << "step " << step;
        }
      }
    }
  }
}

TEST_P(DeviceConformanceTest, SgdWithoutMomentumNeedsNoBuffer) {
  const std::vector<float> p0 = Integers(4097, -50, 50, 51), g = Integers(4097, -9, 9, 52);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
  math::SgdArgs args;
  args.lr = 0.25f;
  args.weight_decay = 0.5f;
  OPTSTEP_ASSERT_OK(device_->updates().Sgd(args, tg, tp, nullptr));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got, Download(tp));
  for (size_t i = 0; i < p0.size(); ++i) {
    ASSERT_EQ(got[i], p0[i] - 0.25f * (g[i] + 0.5f * p0[i])) << i;
  }
}

TEST_P(DeviceConformanceTest, SgdValidates) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor g, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor p, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b9, device_->Allocate(DType::kF32, {9}));
  math::SgdArgs a;
  a.momentum = 0.9f;
  EXPECT_THAT(device_->updates().Sgd(a, g, p, nullptr),
              StatusIs(kInvalid, "Sgd: momentum 0.9 needs a momentum_buffer"));
  EXPECT_THAT(device_->updates().Sgd(a, g, p, &b9),
              StatusIs(kInvalid, "Sgd: momentum_buffer has 9 elements but grad has 8"));
  EXPECT_THAT(device_->updates().Sgd(a, g, p, &p), StatusIs(kInvalid, "same tensor"));
  math::SgdArgs nesterov;
  nesterov.nesterov = true;
  EXPECT_THAT(device_->updates().Sgd(nesterov, g, p, nullptr),
              StatusIs(kInvalid, "Sgd: nesterov needs momentum > 0"));
  math::SgdArgs negative;
  negative.weight_decay = -0.1f;
  EXPECT_THAT(device_->updates().Sgd(negative, g, p, nullptr), StatusIs(kInvalid, "weight_decay"));
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
