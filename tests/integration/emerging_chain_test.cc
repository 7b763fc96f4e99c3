// End to end: the real optstep_server with a chained Muon + AdamW optimizer (spec §4 default
// routing: 2-D weights to Muon, biases to AdamW with wd_mult 0) trains the example MLP through
// optstep::Client; every step is checked against a float64 computation of the same chain from
// the same gradients (spec §5 clipping, §3.4 Muon, §3.1 AdamW). Then the invalid chains that
// CreateSession must refuse with INVALID_ARGUMENT naming the parameter or value.

#include <cmath>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "client/cpp/examples/mlp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_session.h"
#include "tests/server/optim/reference/matrix64.h"
#include "tests/server/optim/reference/muon64.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::StatusIs;

constexpr double kLr = 0.01;
constexpr double kWd = 0.1;

// The chain: Muon (exact fp32 Newton–Schulz, so that float64 is a fair reference) and AdamW.
void AddMuonAdamChain(v1::OptimizerConfig* optimizer) {
  v1::SubOptimizer* muon = optimizer->add_sub_optimizers();
  muon->set_name("muon");
  muon->set_kind("muon");
  muon->mutable_muon()->set_lr(kLr);
  muon->mutable_muon()->set_momentum(0.9);
  muon->mutable_muon()->set_nesterov(true);
  muon->mutable_muon()->set_weight_decay(kWd);
  muon->mutable_muon()->set_fp32_matmul_prec("highest");
  v1::SubOptimizer* adam = optimizer->add_sub_optimizers();
  adam->set_name("adam");
  adam->set_kind("adamw");
  adam->mutable_adamw()->set_lr(kLr);
  adam->mutable_adamw()->set_weight_decay(kWd);
  optimizer->set_clip_grad(1.0);
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::ConnectedServer c, testutil::StartConnected());
    server_ = std::move(c.server);
    client_ = std::move(c.client);
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(ServerTest, ChainedMuonAndAdamWTrainAnMlpLikeTheFloat64Reference) {
  const examples::MlpShape shape;
  const examples::Dataset data = examples::MakeBlobs(shape, 256, 3);
  std::vector<std::vector<float>> params = examples::InitMlp(shape, 4);
  v1::SessionSpec spec = examples::MlpSessionSpec(shape);
  AddMuonAdamChain(spec.mutable_optimizer());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session, client_->CreateSession(spec));
  // Routing: weights (0, 2) to Muon with wd_mult 1, biases (1, 3) to AdamW with wd_mult 0.
  std::vector<std::string> sub_of(4);
  std::vector<double> wd_mult(4);
  for (const v1::GroupInfo& g : session.groups()) {
    for (uint32_t p : g.param_ids()) {
      sub_of[p] = g.sub_optimizer();
      wd_mult[p] = g.wd_mult();
    }
  }
  EXPECT_EQ(sub_of, (std::vector<std::string>{"muon", "adam", "muon", "adam"}));
  EXPECT_EQ(wd_mult, (std::vector<double>{1, 0, 1, 0}));
  for (uint32_t p = 0; p < params.size(); ++p) {
    ASSERT_THAT(client_->InitParameters(session.session_id(), p, params[p]), IsOk());
  }

  // Float64 reference state.
  ref::MuonSpec muon_spec;
  muon_spec.momentum = 0.9;
  muon_spec.nesterov = true;
  std::vector<ref::Muon64> muon;
  muon.emplace_back(muon_spec, shape.hidden, shape.inputs);
  muon.emplace_back(muon_spec, shape.classes, shape.hidden);
  std::vector<std::vector<double>> m(4), v(4);
  for (int p : {1, 3}) {
    m[p].assign(params[p].size(), 0.0);
    v[p].assign(params[p].size(), 0.0);
  }
  const int64_t rows[4] = {shape.hidden, 0, shape.classes, 0};

  double first_loss = 0.0, loss = 0.0;
  for (int step = 1; step <= 10; ++step) {
    examples::LossAndGrads eval = examples::Evaluate(shape, params, data, 0, 256);
    if (step == 1) first_loss = eval.loss;
    loss = eval.loss;
    double sum = 0.0;
    for (const auto& g : eval.grads) {
      for (float x : g) sum += static_cast<double>(x) * x;
    }
    const double norm = std::sqrt(sum);
    const double coef = 1.0 / (norm + 1e-6);
    std::vector<std::vector<double>> want(4);
    for (int p = 0; p < 4; ++p) {
      std::vector<double> g(eval.grads[p].begin(), eval.grads[p].end());
      if (coef < 1.0) {
        for (double& x : g) x *= coef;
      }
      want[p].assign(params[p].begin(), params[p].end());
      if (rows[p] > 0) {  // Muon
        const int64_t cols = static_cast<int64_t>(g.size()) / rows[p];
        ref::Matrix pm(rows[p], cols), gm(rows[p], cols);
        pm.v = want[p];
        gm.v = g;
        muon[p / 2].Step(gm, kLr, kWd * wd_mult[p], pm);
        want[p] = pm.v;
      } else {  // AdamW, wd_mult 0
        for (size_t i = 0; i < g.size(); ++i) {
          m[p][i] = 0.9 * m[p][i] + 0.1 * g[i];
          v[p][i] = 0.999 * v[p][i] + 0.001 * g[i] * g[i];
          want[p][i] -= kLr * (m[p][i] / (1 - std::pow(0.9, step))) /
                        (std::sqrt(v[p][i] / (1 - std::pow(0.999, step))) + 1e-8);
        }
      }
    }
    std::vector<FullGradient> grads;
    for (uint32_t k = 0; k < eval.grads.size(); ++k) grads.push_back({k, eval.grads[k]});
    StepOptions options;
    options.session_id = session.session_id();
    options.step = step;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client_->Step(options, grads));
    ASSERT_EQ(reply.step, static_cast<uint64_t>(step));
    ASSERT_FALSE(reply.skipped);
    EXPECT_NEAR(reply.grad_norm, norm, 1e-6 * norm);
    for (auto& [id, param] : reply.params) params[id] = std::move(param.f32);
    for (int p = 0; p < 4; ++p) {
      double diff = 0.0, total = 0.0;
      for (size_t i = 0; i < want[p].size(); ++i) {
        diff += (params[p][i] - want[p][i]) * (params[p][i] - want[p][i]);
        total += want[p][i] * want[p][i];
      }
      ASSERT_LE(std::sqrt(diff / total), 1e-5) << "step " << step << " param " << p;
    }
  }
  EXPECT_LT(loss, 0.8 * first_loss);
}

TEST_F(ServerTest, InvalidChainsAreRefusedAtSessionCreation) {
  const examples::MlpShape shape;
  struct Case {
    std::string name;
    std::function<void(v1::OptimizerConfig*)> build;
    std::string message;
  };
  auto route_bias_to = [](const char* kind) {
    return [kind](v1::OptimizerConfig* o) {
      v1::SubOptimizer* sub = o->add_sub_optimizers();
      sub->set_name(kind);
      sub->set_kind(kind);
      v1::SubOptimizer* adam = o->add_sub_optimizers();
      adam->set_name("adam");
      adam->set_kind("adamw");
      v1::RoutingRule* rule = o->add_rules();
      rule->set_name_glob("*.bias");
      rule->set_sub_optimizer(kind);
    };
  };
  auto muon_with = [](std::function<void(v1::MuonOptions*)> set) {
    return [set](v1::OptimizerConfig* o) {
      AddMuonAdamChain(o);
      set(o->mutable_sub_optimizers(0)->mutable_muon());
    };
  };
  const Case cases[] = {
      {"1-D param to Muon", route_bias_to("muon"),
       "param 'fc1.bias': muon needs a 2-D parameter, got shape [32]"},
      {"1-D param to SOAP", route_bias_to("soap"),
       "param 'fc1.bias': soap needs a 2-D parameter, got shape [32]"},
      {"1-D param to AdaptiveMuon", route_bias_to("adaptive_muon"),
       "param 'fc1.bias': adaptive_muon needs a 2-D parameter"},
      {"bad coefficient type",
       muon_with([](v1::MuonOptions* m) { m->set_coefficient_type("cubic"); }),
       "coefficient_type 'cubic' is not one of"},
      {"num_ns_steps 0", muon_with([](v1::MuonOptions* m) { m->set_num_ns_steps(0); }),
       "num_ns_steps = 0 must be >= 1"},
      {"custom without coefficients",
       muon_with([](v1::MuonOptions* m) { m->set_coefficient_type("custom"); }),
       "coefficient_type 'custom' needs a non-empty list of (a, b, c) triples; got 0"},
      {"bad precision", muon_with([](v1::MuonOptions* m) { m->set_fp32_matmul_prec("low"); }),
       "fp32_matmul_prec: matmul precision 'low'"},
      {"F < 1",
       [](v1::OptimizerConfig* o) {
         v1::SubOptimizer* soap = o->add_sub_optimizers();
         soap->set_name("soap");
         soap->set_kind("soap");
         soap->mutable_soap()->set_precondition_frequency(0);
         o->add_sub_optimizers()->set_name("adam");
         o->mutable_sub_optimizers(1)->set_kind("adamw");
       },
       "precondition_frequency = 0 must be >= 1"},
      {"unknown preset argument",
       [](v1::OptimizerConfig* o) {
         o->set_preset("muon");
         (*o->mutable_megatron_args())["muon_warmup"] = "3";
       },
       "megatron_args key 'muon_warmup' does not apply to preset 'muon'"},
      {"unparsable preset argument",
       [](v1::OptimizerConfig* o) {
         o->set_preset("soap");
         (*o->mutable_megatron_args())["soap_precondition_frequency"] = "often";
       },
       "megatron_args['soap_precondition_frequency'] = 'often' is not an integer"},
      {"unknown optimizer kind",
       [](v1::OptimizerConfig* o) {
         o->add_sub_optimizers()->set_name("x");
         o->mutable_sub_optimizers(0)->set_kind("shampoo");
       },
       "sub_optimizer 'x': unknown optimizer kind 'shampoo'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::SessionSpec spec = examples::MlpSessionSpec(shape);
    c.build(spec.mutable_optimizer());
    EXPECT_THAT(client_->CreateSession(spec).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message));
  }
  // The Megatron presets are accepted as they are.
  for (const char* preset : {"muon", "dist_muon", "adaptive_muon", "soap", "lion"}) {
    v1::SessionSpec spec = examples::MlpSessionSpec(shape);
    spec.mutable_optimizer()->set_preset(preset);
    EXPECT_THAT(client_->CreateSession(spec).status(), IsOk()) << preset;
  }
}

}  // namespace
}  // namespace optstep
