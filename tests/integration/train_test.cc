// End to end: the real optstep_server binary on a free port, a C++ trainer driving it through
// optstep::Client for 50 steps, checked step by step against a float64 computation of the same
// optimizer (spec §3.1, §3.2, §5) from the same gradients.

#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/examples/mlp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;

using Vectors = std::vector<std::vector<double>>;

// The float64 reference optimizer: one step from parameters `p` and gradients `g`.
class Reference {
 public:
  virtual ~Reference() = default;
  virtual void Step(const Vectors& g, double lr, const std::vector<double>& lambda, Vectors& p) = 0;
};

class AdamWReference final : public Reference {
 public:
  void Step(const Vectors& g, double lr, const std::vector<double>& lambda, Vectors& p) override {
    if (m_.empty()) {
      for (const auto& x : p) {
        m_.emplace_back(x.size(), 0.0);
        v_.emplace_back(x.size(), 0.0);
      }
    }
    ++t_;
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) {
        m_[k][i] = 0.9 * m_[k][i] + 0.1 * g[k][i];
        v_[k][i] = 0.999 * v_[k][i] + 0.001 * g[k][i] * g[k][i];
        const double d = (m_[k][i] / (1 - std::pow(0.9, t_))) /
                             (std::sqrt(v_[k][i] / (1 - std::pow(0.999, t_))) + 1e-8) +
                         lambda[k] * p[k][i];
        p[k][i] -= lr * d;
      }
    }
  }

 private:
  Vectors m_, v_;
  int t_ = 0;
};

class SgdReference final : public Reference {
 public:
  void Step(const Vectors& g, double lr, const std::vector<double>& lambda, Vectors& p) override {
    const bool first = b_.empty();
    if (first) {
      for (const auto& x : p) b_.emplace_back(x.size(), 0.0);
    }
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double d = g[k][i] + lambda[k] * p[k][i];
        b_[k][i] = first ? d : 0.9 * b_[k][i] + d;
        p[k][i] -= lr * (d + 0.9 * b_[k][i]);  // Nesterov
      }
    }
  }

 private:
  Vectors b_;
};

double RelativeError(const std::vector<std::vector<float>>& got, const Vectors& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t k = 0; k < want.size(); ++k) {
    for (size_t i = 0; i < want[k].size(); ++i) {
      diff += (got[k][i] - want[k][i]) * (got[k][i] - want[k][i]);
      norm += want[k][i] * want[k][i];
    }
  }
  return std::sqrt(diff / norm);
}

class TrainTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainTest, FiftyStepsMatchTheFloat64Reference) {
  const std::string kind = GetParam();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));

  const examples::MlpShape shape;
  const examples::Dataset data = examples::MakeBlobs(shape, 256, 3);
  std::vector<std::vector<float>> params = examples::InitMlp(shape, 4);
  v1::SessionSpec spec = examples::MlpSessionSpec(shape);
  v1::SubOptimizer* sub = spec.mutable_optimizer()->add_sub_optimizers();
  sub->set_name(kind);
  sub->set_kind(kind);
  std::unique_ptr<Reference> reference;
  double lr, wd;
  if (kind == "adamw") {
    lr = 1e-2, wd = 0.1;
    sub->mutable_adamw()->set_lr(lr);
    sub->mutable_adamw()->set_weight_decay(wd);
    reference = std::make_unique<AdamWReference>();
  } else {
    lr = 0.05, wd = 0.01;
    sub->mutable_sgd()->set_lr(lr);
    sub->mutable_sgd()->set_weight_decay(wd);
    sub->mutable_sgd()->set_momentum(0.9);
    sub->mutable_sgd()->set_nesterov(true);
    reference = std::make_unique<SgdReference>();
  }
  spec.mutable_optimizer()->set_clip_grad(1.0);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session, client->CreateSession(spec));
  for (uint32_t p = 0; p < params.size(); ++p) {
    ASSERT_THAT(client->InitParameters(session.session_id(), p, params[p]), IsOk());
  }
  // wd_mult: 1 for the weights, 0 for the biases (spec §4).
  const std::vector<double> lambda = {wd, 0.0, wd, 0.0};

  double first_loss = 0.0, loss = 0.0;
  int clipped_steps = 0;
  for (int step = 1; step <= 50; ++step) {
    const double step_lr = lr * (step <= 10 ? step / 10.0 : 1.0);  // warm-up through the header
    examples::LossAndGrads eval = examples::Evaluate(shape, params, data, 0, 256);
    if (step == 1) first_loss = eval.loss;
    loss = eval.loss;
    // Reference: clip (spec §5) then step, in float64, from the server's current parameters.
    double sum = 0.0;
    for (const auto& g : eval.grads) {
      for (float x : g) sum += double(x) * x;
    }
    const double norm = std::sqrt(sum);
    const double coef = 1.0 / (norm + 1e-6);
    Vectors g64, p64;
    for (size_t k = 0; k < params.size(); ++k) {
      g64.emplace_back(eval.grads[k].begin(), eval.grads[k].end());
      if (coef < 1.0) {
        for (double& x : g64.back()) x *= coef;
      }
      p64.emplace_back(params[k].begin(), params[k].end());
    }
    reference->Step(g64, step_lr, lambda, p64);

    std::vector<FullGradient> grads;
    for (uint32_t k = 0; k < eval.grads.size(); ++k) grads.push_back({k, eval.grads[k]});
    StepOptions step_options;
    step_options.session_id = session.session_id();
    step_options.step = step;
    for (const v1::GroupInfo& group : session.groups()) {
      step_options.groups.push_back({group.id(), step_lr, wd});
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(step_options, grads));
    ASSERT_EQ(reply.step, static_cast<uint64_t>(step));
    ASSERT_FALSE(reply.skipped);
    EXPECT_NEAR(reply.grad_norm, norm, 1e-6 * norm);
    clipped_steps += reply.clipped;
    ASSERT_EQ(reply.params.size(), params.size());
    for (auto& [id, param] : reply.params) params[id] = std::move(param.f32);
    ASSERT_LE(RelativeError(params, p64), 1e-6) << "step " << step;
  }
  EXPECT_GT(clipped_steps, 0);  // the first steps are clipped, the later ones not
  EXPECT_LT(clipped_steps, 50);
  EXPECT_LT(loss, 0.5 * first_loss);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters pulled, client->PullParameters(session.session_id(), DType::kF32));
  EXPECT_EQ(pulled.step, 50u);
  for (auto& [id, param] : pulled.params) EXPECT_EQ(param.f32, params[id]);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainTest, ::testing::Values("adamw", "sgd"));

TEST(ServerLifecycleTest, SigtermStopsServingAndExitsCleanly) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start({"--shutdown_grace_ms=2000"}));
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  // SERVING once the rank has joined its group (at once for one rank).
  bool serving = false;
  for (int i = 0; i < 100 && !serving; ++i) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(serving, client->CheckHealth());
    if (!serving) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(serving);
  const int status = server->SignalAndWait(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace optstep
