// AdamW and SGD as optimizers (state, counters, weight-decay multiplier) over the CPU device,
// against float64 plain-loop references of docs/spec/optimizers.md §3.1-3.2.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_factory.h"
#include "server/optim/adamw.h"
#include "server/optim/sgd.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;

std::vector<float> Read(Device& d, const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_THAT(d.CopyToHost(t, 0, t.numel(), DType::kF32, v.data()), IsOk());
  return v;
}

void Write(Device& d, const std::vector<float>& v, Tensor& t) {
  ASSERT_THAT(d.CopyFromHost(v.data(), DType::kF32, t.numel(), t, 0), IsOk());
}

struct Case {
  bool decoupled;
  double wd_mult;
};

class AdamWStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(AdamWStepTest, TenStepsMatchFloat64Reference) {
  const Case c = GetParam();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto device, CreateDevice(DeviceOptions{}));
  AdamWConfig config;
  config.lr = 1e-2;
  config.beta1 = 0.8;
  config.beta2 = 0.95;
  config.eps = 1e-6;
  config.weight_decay = 0.1;
  config.decoupled = c.decoupled;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto adamw, AdamW::Create("test", config));
  const ParamInfo info{"w", {17, 9}};
  const int n = 17 * 9;
  ParamState state;
  ASSERT_THAT(adamw->InitState(*device, info, state), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor param, device->Allocate(DType::kF32, info.shape));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor grad, device->Allocate(DType::kF32, info.shape));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> p0(n);
  for (float& x : p0) x = normal(rng);
  Write(*device, p0, param);
  std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
  for (int t = 1; t <= 10; ++t) {
    std::vector<float> g(n);
    for (float& x : g) x = normal(rng) * 0.1f;
    Write(*device, g, grad);
    StepArgs args;
    args.lr = config.lr * (1.0 - 0.05 * t);  // a schedule
    args.weight_decay = config.weight_decay * c.wd_mult;
    args.group_step = t;
    ASSERT_THAT(adamw->Step(*device, args, grad, param, state), IsOk());
    const double lambda = args.weight_decay;
    for (int i = 0; i < n; ++i) {
      double gi = g[i];
      if (!c.decoupled) gi += lambda * p[i];
      m[i] = config.beta1 * m[i] + (1 - config.beta1) * gi;
      v[i] = config.beta2 * v[i] + (1 - config.beta2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(config.beta1, t));
      const double vhat = v[i] / (1 - std::pow(config.beta2, t));
      double d = mhat / (std::sqrt(vhat) + config.eps);
      if (c.decoupled) d += lambda * p[i];
      p[i] -= args.lr * d;
    }
  }
  const std::vector<float> got = Read(*device, param);
  const std::vector<float> m_got = Read(*device, *state.Find("exp_avg"));
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(got[i], p[i], 1e-7 + 1e-6 * std::abs(p[i])) << i;
    EXPECT_NEAR(m_got[i], m[i], 1e-7 + 1e-6 * std::abs(m[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdamWStepTest,
                         ::testing::Values(Case{true, 0.0}, Case{true, 1.0}, Case{false, 0.0},
                                           Case{false, 1.0}));

TEST(SgdStepTest, MomentumAndNesterovExactOnIntegerData) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto device, CreateDevice(DeviceOptions{}));
  for (bool nesterov : {false, true}) {
    SgdConfig config;
    config.lr = 0.25;
    config.momentum = 0.5;
    config.weight_decay = 0.5;
    config.nesterov = nesterov;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto sgd, Sgd::Create("test", config));
    const ParamInfo info{"w", {4}};
    ParamState state;
    ASSERT_THAT(sgd->InitState(*device, info, state), IsOk());
    ASSERT_NE(state.Find("momentum_buffer"), nullptr);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor param, device->Allocate(DType::kF32, info.shape));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor grad, device->Allocate(DType::kF32, info.shape));
    std::vector<double> p = {4, -8, 2, 0}, b(4, 0.0);
    Write(*device, {4, -8, 2, 0}, param);
    for (int t = 1; t <= 3; ++t) {
      std::vector<float> g = {1, 2, -3, static_cast<float>(t)};
      Write(*device, g, grad);
      StepArgs args;
      args.lr = 0.25;
      args.weight_decay = 0.5;
      args.group_step = t;
      ASSERT_THAT(sgd->Step(*device, args, grad, param, state), IsOk());
      for (int i = 0; i < 4; ++i) {
        const double d = g[i] + 0.5 * p[i];
        b[i] = t == 1 ? d : 0.5 * b[i] + d;
        p[i] -= 0.25 * (nesterov ? d + 0.5 * b[i] : b[i]);
      }
      const std::vector<float> got = Read(*device, param);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], p[i]) << "step " << t << " i " << i;
    }
  }
}

TEST(SgdStepTest, NoMomentumNeedsNoState) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto device, CreateDevice(DeviceOptions{}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto sgd, Sgd::Create("test", SgdConfig{}));
  ParamState state;
  ASSERT_THAT(sgd->InitState(*device, ParamInfo{"w", {3}}, state), IsOk());
  EXPECT_TRUE(state.tensors.empty());
}

}  // namespace
}  // namespace optstep
