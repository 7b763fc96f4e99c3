// Device conformance, part 3: the element-wise updates of the emerging optimizers (Lion,
// MuonMomentum, Adamuon, NormuonMoment, SoapAdam, Axpby; spec §3.3-3.6) against float64
// plain-loop references written here, bit-for-bit against the shared formulas, and their
// argument checks.

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
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
constexpr math::WeightDecayMode kModes[] = {
    math::WeightDecayMode::kDecoupled, math::WeightDecayMode::kIndependent,
    math::WeightDecayMode::kL2, math::WeightDecayMode::kPalm};

// |got − want| <= atol + rtol·|want|.
::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<double>& want,
                                double rtol, double atol) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// spec §2 in float64: the decayed gradient; decays p in place.
double Decay64(math::WeightDecayMode mode, double lr, double lambda, double g, double& p) {
  switch (mode) {
    case math::WeightDecayMode::kDecoupled:
      p -= lr * lambda * p;
      return g;
    case math::WeightDecayMode::kIndependent:
      p -= lambda * p;
      return g;
    case math::WeightDecayMode::kL2:
      return g + lambda * p;
    case math::WeightDecayMode::kPalm:
      p -= lambda * lr * lr * p;
      return g;
  }
  return g;
}

TEST_P(DeviceConformanceTest, LionMatchesFloat64ForEveryDecayMode) {
  for (math::WeightDecayMode mode : kModes) {
    for (int64_t n : ConformanceSizes()) {
      SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(mode) << " n " << n);
      const std::vector<float> p0 = Normal(n, 1.0f, 1);
      std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tm, device_->Allocate(DType::kF32, {n}));
      for (int t = 1; t <= 3; ++t) {
        const std::vector<float> g = Normal(n, 1.0f, 10 + t);
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
        const double lr = 1e-3 * t, lambda = 0.1;
        OPTSTEP_ASSERT_OK(
            device_->updates().Lion(math::MakeLionArgs(lr, 0.9, 0.99, mode, lambda), tg, tp, tm));
        for (int64_t i = 0; i < n; ++i) {
          const double gi = Decay64(mode, lr, lambda, g[i], p[i]);
          const double c = 0.9 * m[i] + 0.1 * gi;
          m[i] = 0.99 * m[i] + 0.01 * gi;
          p[i] -= lr * ((c > 0) - (c < 0));
        }
      }
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_p, Download(tp));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> got_m, Download(tm));
      EXPECT_TRUE(Near(got_p, p, 1e-6, 1e-6));
      EXPECT_TRUE(Near(got_m, m, 1e-6, 1e-6));
    }
  }
}

// spec §9.3 on integer parameters in [1, 5).
TEST_P(DeviceConformanceTest, LionExactSteps) {
  const std::vector<float> p0 = Integers(4097, 1, 4, 2);
  const std::vector<float> zero(4097, 0.0f);
  auto step = [&](math::WeightDecayMode mode, double lr, double lambda, double beta2,
                  const std::vector<float>& g, std::vector<float>* m_out) -> std::vector<float> {
    auto tp = Upload(p0);
    auto tg = Upload(g);
    auto tm = device_->Allocate(DType::kF32, {4097});
    EXPECT_TRUE(tp.ok() && tg.ok() && tm.ok());
    EXPECT_THAT(device_->updates().Lion(math::MakeLionArgs(lr, 0.9, beta2, mode, lambda), *tg, *tp, *tm),
                testutil::IsOk());
    if (m_out != nullptr) *m_out = *Download(*tm);
    return *Download(*tp);
  };
  const std::vector<float> g = Integers(4097, -6, 6, 3);
  std::vector<float> m;
  const std::vector<float> moved = step(kModes[0], 0.25, 0.0, 0.75, g, &m);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(m[i], 0.25f * g[i]);
    ASSERT_EQ(std::fabs(moved[i] - p0[i]), g[i] == 0.0f ? 0.0f : 0.25f);
  }
  std::vector<float> want(p0.size());
  auto each = [&](float (*f)(float)) {
    for (size_t i = 0; i < p0.size(); ++i) want[i] = f(p0[i]);
    return want;
  };
  EXPECT_THAT(step(kModes[0], 0.25, 0.5, 0.99, zero, nullptr),
              ElementsAreArray(each([](float x) { return x * 0.875f; })));
  EXPECT_THAT(step(math::WeightDecayMode::kL2, 0.25, 0.5, 0.99, zero, nullptr),
              ElementsAreArray(each([](float x) { return x - 0.25f; })));
  EXPECT_THAT(
      step(math::WeightDecayMode::kL2, 0.25, 0.125, 0.99, Integers(4097, -10, -6, 4), nullptr),
      ElementsAreArray(each([](float x) { return x + 0.25f; })));
  EXPECT_THAT(step(math::WeightDecayMode::kIndependent, 0.25, 0.5, 0.99, zero, nullptr),
              ElementsAreArray(each([](float x) { return x * 0.5f; })));
}

TEST_P(DeviceConformanceTest, MuonMomentumMatchesFloat64) {
  for (bool nesterov : {false, true}) {
    for (math::WeightDecayMode mode : kModes) {
      const int64_t n = 65537 + 3;
      SCOPED_TRACE(::testing::Message()
                   << "nesterov " << nesterov << " mode " << static_cast<int>(mode));
      const std::vector<float> p0 = Normal(n, 1.0f, 5);
      std::vector<double> p(p0.begin(), p0.end()), b(n, 0.0), u(n);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, device_->Allocate(DType::kF32, {n}));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tu, device_->Allocate(DType::kF32, {n}));
      for (int t = 1; t <= 3; ++t) {
        const std::vector<float> g = Normal(n, 1.0f, 20 + t);
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
        OPTSTEP_ASSERT_OK(device_->updates().MuonMomentum(
            math::MakeMuonMomentumArgs(0.9, nesterov, mode, 0.02, 0.1), tg, tp, tb, tu));
        for (int64_t i = 0; i < n; ++i) {
          const double gi = Decay64(mode, 0.02, 0.1, g[i], p[i]);
          b[i] = 0.9 * b[i] + 0.1 * gi;
          u[i] = nesterov ? 0.1 * gi + 0.9 * b[i] : b[i];
        }
      }
      EXPECT_TRUE(Near(*Download(tp), p, 1e-6, 1e-7));
      EXPECT_TRUE(Near(*Download(tb), b, 1e-6, 1e-7));
      EXPECT_TRUE(Near(*Download(tu), u, 1e-6, 1e-7));
    }
  }
}

TEST_P(DeviceConformanceTest, AdamuonAndNormuonMomentMatchFloat64) {
  const int64_t n = 4097;
  const std::vector<float> p0 = Normal(n, 1.0f, 6);
  std::vector<double> p(p0.begin(), p0.end()), v(n, 0.0);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv, device_->Allocate(DType::kF32, {n}));
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float> o = Normal(n, 2.0f, 30 + t);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor to, Upload(o));
    OPTSTEP_ASSERT_OK(device_->updates().Adamuon(math::MakeMoment2Args(0.01, 0.95, 1e-8, 1), to, tp, tv));
    for (int64_t i = 0; i < n; ++i) {
      v[i] = 0.95 * v[i] + 0.05 * o[i] * o[i];
      p[i] -= 0.01 * o[i] / (std::sqrt(v[i]) + 1e-8);
    }
  }
  EXPECT_TRUE(Near(*Download(tp), p, 1e-6, 1e-6));
  EXPECT_TRUE(Near(*Download(tv), v, 1e-6, 1e-7));
  // normuon: v ← β2·v + (1−β2)·sum/count; scale = 1/√max(v, ε).
  const std::vector<float> sums = Uniform(65, 0.0f, 10.0f, 7);
  std::vector<float> sums_eps = sums;
  sums_eps[3] = 0.0f;  // clamped by ε
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ts, Upload({65, 1}, sums_eps));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor moment, device_->Allocate(DType::kF32, {65, 1}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor scale, device_->Allocate(DType::kF32, {65, 1}));
  OPTSTEP_ASSERT_OK(
      device_->updates().NormuonMoment(math::MakeMoment2Args(0.0, 0.9, 1e-4, 7), ts, moment, scale));
  std::vector<double> want_v(65), want_s(65);
  for (int i = 0; i < 65; ++i) {
    want_v[i] = 0.1 * sums_eps[i] / 7.0;
    want_s[i] = 1.0 / std::sqrt(std::max(want_v[i], 1e-4));
  }
  EXPECT_TRUE(Near(*Download(moment), want_v, 1e-6, 0.0));
  EXPECT_TRUE(Near(*Download(scale), want_s, 1e-6, 0.0));
}

TEST_P(DeviceConformanceTest, SoapAdamMatchesFloat64) {
  for (bool correct_bias : {true, false}) {
    for (bool nesterov : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bias " << correct_bias << " nesterov " << nesterov);
      const int64_t n = 4097;
      std::vector<double> m(n, 0.0), v(n, 0.0), d(n);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tm, device_->Allocate(DType::kF32, {n}));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv, device_->Allocate(DType::kF32, {n}));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor td, device_->Allocate(DType::kF32, {n}));
      for (int t = 1; t <= 3; ++t) {
        const std::vector<float> g = Normal(n, 1.0f, 40 + t);
        OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
        OPTSTEP_ASSERT_OK(device_->updates().SoapAdam(
            math::MakeSoapAdamArgs(0.9, 0.95, 1e-8, correct_bias, nesterov, t), tg, tm, tv, td));
        const double bc1 = correct_bias ? 1 - std::pow(0.9, t) : 1.0;
        const double bc2 = correct_bias ? 1 - std::pow(0.95, t) : 1.0;
        for (int64_t i = 0; i < n; ++i) {
          m[i] = 0.9 * m[i] + 0.1 * g[i];
          v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
          double num = m[i] / bc1;
          if (nesterov) {
            num = correct_bias ? 0.9 * m[i] / (1 - std::pow(0.9, t + 1)) + 0.1 * g[i] / bc1
                               : 0.9 * m[i] + 0.1 * g[i];
          }
          d[i] = num / (std::sqrt(v[i] / bc2) + 1e-8);
        }
      }
      EXPECT_TRUE(Near(*Download(td), d, 1e-5, 1e-6));
      EXPECT_TRUE(Near(*Download(tm), m, 1e-6, 1e-7));
      EXPECT_TRUE(Near(*Download(tv), v, 1e-6, 1e-7));
    }
  }
}

TEST_P(DeviceConformanceTest, AxpbyIncludingAliasAndBetaZero) {
  const std::vector<float> x = Normal(4097, 1.0f, 50);
  std::vector<float> y(4097, std::nanf(""));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tx, Upload(x));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ty, Upload(y));
  OPTSTEP_ASSERT_OK(device_->Axpby(2.0f, tx, 0.0f, ty));  // y is not read
  std::vector<float> want(4097);
  for (size_t i = 0; i < x.size(); ++i) want[i] = 2.0f * x[i];
  EXPECT_THAT(*Download(ty), ElementsAreArray(want));
  OPTSTEP_ASSERT_OK(device_->Axpby(-0.5f, tx, 1.0f, tx));  // x ← x − x/2
  for (size_t i = 0; i < x.size(); ++i) want[i] = -0.5f * x[i] + x[i];
  EXPECT_THAT(*Download(tx), ElementsAreArray(want));
}

// One source of truth: each device computes exactly the kernels/math formula.
TEST_P(DeviceConformanceTest, EmergingUpdatesAreBitwiseTheSharedFormulas) {
  const int64_t n = 65540;
  const std::vector<float> g = Normal(n, 1.0f, 60), p0 = Normal(n, 1.0f, 61),
                           s0 = Uniform(n, 0.0f, 2.0f, 62);
  for (math::WeightDecayMode mode : kModes) {
    const math::LionArgs lion = math::MakeLionArgs(3e-3, 0.9, 0.99, mode, 0.1);
    const math::MuonMomentumArgs muon = math::MakeMuonMomentumArgs(0.95, true, mode, 0.02, 0.1);
    std::vector<float> p = p0, m = s0, b = s0, u(n);
    for (int64_t i = 0; i < n; ++i) math::LionElement(lion, g[i], p[i], m[i]);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tg, Upload(g));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tm, Upload(s0));
    OPTSTEP_ASSERT_OK(device_->updates().Lion(lion, tg, tp, tm));
    EXPECT_THAT(*Download(tp), ElementsAreArray(p));
    EXPECT_THAT(*Download(tm), ElementsAreArray(m));
    p = p0;
    for (int64_t i = 0; i < n; ++i) math::MuonMomentumElement(muon, g[i], p[i], b[i], u[i]);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp2, Upload(p0));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, Upload(s0));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tu, device_->Allocate(DType::kF32, {n}));
    OPTSTEP_ASSERT_OK(device_->updates().MuonMomentum(muon, tg, tp2, tb, tu));
    EXPECT_THAT(*Download(tp2), ElementsAreArray(p));
    EXPECT_THAT(*Download(tb), ElementsAreArray(b));
    EXPECT_THAT(*Download(tu), ElementsAreArray(u));
  }
  const math::Moment2Args moment = math::MakeMoment2Args(0.01, 0.95, 1e-8, 1);
  std::vector<float> p = p0, v = s0;
  for (int64_t i = 0; i < n; ++i) math::AdamuonElement(moment, g[i], p[i], v[i]);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor to, Upload(g));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tp, Upload(p0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv, Upload(s0));
  OPTSTEP_ASSERT_OK(device_->updates().Adamuon(moment, to, tp, tv));
  EXPECT_THAT(*Download(tp), ElementsAreArray(p));
  EXPECT_THAT(*Download(tv), ElementsAreArray(v));
  const math::SoapAdamArgs soap = math::MakeSoapAdamArgs(0.9, 0.999, 1e-8, true, true, 7);
  std::vector<float> m = s0, v2 = s0, d(n);
  for (int64_t i = 0; i < n; ++i) math::SoapAdamElement(soap, g[i], m[i], v2[i], d[i]);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tm, Upload(s0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv2, Upload(s0));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor td, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK(device_->updates().SoapAdam(soap, to, tm, tv2, td));
  EXPECT_THAT(*Download(td), ElementsAreArray(d));
  EXPECT_THAT(*Download(tm), ElementsAreArray(m));
}

// A device may take a vector path where every pointer is aligned (CUDA: float4 loads and stores)
// and a scalar one elsewhere: views one float into their buffers take the other path, and every
// element must still be the shared formula's.
TEST_P(DeviceConformanceTest, EmergingUpdatesDoNotDependOnAlignment) {
  const int64_t n = 4099;
  const std::vector<float> g = Normal(n + 1, 1.0f, 70), p0 = Normal(n + 1, 1.0f, 71),
                           s0 = Uniform(n + 1, 0.0f, 2.0f, 72);
  // The last n elements of `values` uploaded whole (n + 1): a view that is not 16-byte aligned.
  // `wholes` keeps the buffers.
  std::vector<Tensor> wholes;
  auto unaligned = [&](const std::vector<float>& values) {
    wholes.push_back(Upload(values).value());
    return Tensor(DType::kF32, {n}, static_cast<float*>(wholes.back().data()) + 1,
                  Tensor::Deleter());
  };
  auto tail = [](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + 1, v.end());
  };
  const math::LionArgs lion =
      math::MakeLionArgs(3e-3, 0.9, 0.99, math::WeightDecayMode::kDecoupled, 0.1);
  const math::MuonMomentumArgs muon =
      math::MakeMuonMomentumArgs(0.95, true, math::WeightDecayMode::kDecoupled, 0.02, 0.1);
  const math::SoapAdamArgs soap = math::MakeSoapAdamArgs(0.9, 0.999, 1e-8, true, true, 7);
  std::vector<float> p = tail(p0), m = tail(s0), b = tail(s0), u(n), m2 = tail(s0), v2 = tail(s0),
                     d(n), y(n);
  const std::vector<float> gg = tail(g), zeros(n + 1, 0.0f);
  std::vector<float> p_muon = p;
  for (int64_t i = 0; i < n; ++i) {
    math::LionElement(lion, gg[i], p[i], m[i]);
    math::MuonMomentumElement(muon, gg[i], p_muon[i], b[i], u[i]);
    math::SoapAdamElement(soap, gg[i], m2[i], v2[i], d[i]);
    y[i] = 0.5f * gg[i] + 0.25f * p0[i + 1];
  }
  Tensor g1 = unaligned(g), p1 = unaligned(p0), m1 = unaligned(s0);
  OPTSTEP_ASSERT_OK(device_->updates().Lion(lion, g1, p1, m1));
  EXPECT_THAT(*Download(p1), ElementsAreArray(p));
  EXPECT_THAT(*Download(m1), ElementsAreArray(m));
  Tensor p2 = unaligned(p0), b1 = unaligned(s0), u1 = unaligned(zeros);
  OPTSTEP_ASSERT_OK(device_->updates().MuonMomentum(muon, g1, p2, b1, u1));
  EXPECT_THAT(*Download(p2), ElementsAreArray(p_muon));
  EXPECT_THAT(*Download(b1), ElementsAreArray(b));
  EXPECT_THAT(*Download(u1), ElementsAreArray(u));
  Tensor m3 = unaligned(s0), v3 = unaligned(s0), d1 = unaligned(zeros);
  OPTSTEP_ASSERT_OK(device_->updates().SoapAdam(soap, g1, m3, v3, d1));
  EXPECT_THAT(*Download(d1), ElementsAreArray(d));
  EXPECT_THAT(*Download(m3), ElementsAreArray(m2));
  EXPECT_THAT(*Download(v3), ElementsAreArray(v2));
  Tensor y1 = unaligned(p0);
  OPTSTEP_ASSERT_OK(device_->Axpby(0.25f, y1, 0.0f, y1));  // β = 0: y is written, not read
  OPTSTEP_ASSERT_OK(device_->Axpby(0.5f, g1, 1.0f, y1));
  EXPECT_THAT(*Download(y1), ElementsAreArray(y));
}

TEST_P(DeviceConformanceTest, EmergingUpdatesRefuseBadArguments) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor c, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor d, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor short_t, device_->Allocate(DType::kF32, {7}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor half, device_->Allocate(DType::kBF16, {8}));
  math::LionArgs lion;
  lion.beta1 = 1.0f;
  EXPECT_THAT(device_->updates().Lion(lion, a, b, c),
              StatusIs(kInvalid, "Lion: beta1 must be in [0, 1), got 1"));
  EXPECT_THAT(device_->updates().Lion(math::LionArgs{}, a, b, short_t),
              StatusIs(kInvalid, "Lion: exp_avg has 7 elements but grad has 8"));
  EXPECT_THAT(device_->updates().Lion(math::LionArgs{}, a, b, b),
              StatusIs(kInvalid, "Lion: param and exp_avg are the same tensor"));
  EXPECT_THAT(device_->updates().MuonMomentum(math::MuonMomentumArgs{}, a, b, c, half),
              StatusIs(kInvalid, "MuonMomentum: update is bf16"));
  math::Moment2Args moment;
  moment.eps = -1.0f;
  EXPECT_THAT(device_->updates().Adamuon(moment, a, b, c), StatusIs(kInvalid, "Adamuon: eps"));
  moment = math::Moment2Args{};
  moment.count = 0.0f;
  EXPECT_THAT(device_->updates().NormuonMoment(moment, a, b, c), StatusIs(kInvalid, "NormuonMoment: count"));
  EXPECT_THAT(device_->updates().NormuonMoment(math::Moment2Args{}, a, b, b),
              StatusIs(kInvalid, "same tensor"));
  math::SoapAdamArgs soap;
  soap.bias_correction1 = 0.0f;
  EXPECT_THAT(device_->updates().SoapAdam(soap, a, b, c, d),
              StatusIs(kInvalid, "SoapAdam: bias_correction1 must be in (0, 1]"));
  EXPECT_THAT(device_->Axpby(NAN, a, 1.0f, b), StatusIs(kInvalid, "Axpby: alpha must be finite"));
  EXPECT_THAT(device_->Axpby(1.0f, short_t, 1.0f, b), StatusIs(kInvalid, "Axpby: y has 8"));
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
