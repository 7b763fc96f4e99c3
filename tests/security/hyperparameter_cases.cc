// CreateSession with an optimizer chain that is malformed or has a hyperparameter out of its
// bounds (docs/spec/optimizers.md §3.0).

#include <limits>

#include "optstep/v1/optimizer_service.pb.h"
#include "tests/integration/test_session.h"
#include "tests/security/bad_input_calls.h"
#include "tests/security/bad_input_cases.h"

namespace optstep {
namespace testutil {
namespace {

using Code = grpc::StatusCode;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::SubOptimizer* AddSub(v1::OptimizerConfig& config, const std::string& name,
                         const std::string& kind) {
  v1::SubOptimizer* sub = config.add_sub_optimizers();
  sub->set_name(name);
  sub->set_kind(kind);
  return sub;
}

// A CreateSession case of SmallSpec("bad") whose optimizer is a chain built by `edit` (the
// preset cleared).
BadInput Chain(std::string name, std::function<void(v1::OptimizerConfig&)> edit,
               std::string message, Code code = Code::INVALID_ARGUMENT) {
  return {std::move(name),
          [edit](const Target& t) {
            v1::SessionSpec spec = SmallSpec("bad");
            spec.mutable_optimizer()->clear_preset();
            edit(*spec.mutable_optimizer());
            return CallCreate(t.channel, spec);
          },
          code, std::move(message)};
}

// Muon "m" for the matrix, AdamW "a" for the bias; `edit` changes Muon's options.
BadInput Muon(std::string name, std::function<void(v1::MuonOptions&)> edit, std::string message) {
  return Chain(
      std::move(name),
      [edit](v1::OptimizerConfig& c) {
        edit(*AddSub(c, "m", "muon")->mutable_muon());
        AddSub(c, "a", "adamw")->mutable_adamw();
      },
      std::move(message));
}

template <typename Options>
BadInput Single(std::string name, const std::string& kind, Options* (v1::SubOptimizer::*options)(),
                std::function<void(Options&)> edit, std::string message) {
  return Chain(
      std::move(name), [=](v1::OptimizerConfig& c) { edit(*(AddSub(c, "s", kind)->*options)()); },
      std::move(message));
}

BadInput Adam(std::string name, std::function<void(v1::AdamWOptions&)> edit, std::string message) {
  return Single(std::move(name), "adamw", &v1::SubOptimizer::mutable_adamw, std::move(edit),
                std::move(message));
}

BadInput Soap(std::string name, std::function<void(v1::SoapOptions&)> edit, std::string message) {
  return Single(std::move(name), "soap", &v1::SubOptimizer::mutable_soap, std::move(edit),
                std::move(message));
}

// AdamW "a" for everything, through a rule with `edit`'s overrides.
BadInput Override(std::string name, std::function<void(v1::GroupOverrides&)> edit,
                  std::string message) {
  return Chain(
      std::move(name),
      [edit](v1::OptimizerConfig& c) {
        AddSub(c, "a", "adamw")->mutable_adamw();
        v1::RoutingRule* rule = c.add_rules();
        rule->set_name_glob("*");
        rule->set_sub_optimizer("a");
        edit(*rule->mutable_overrides());
      },
      std::move(message));
}

}  // namespace

std::vector<BadInput> HyperparameterCases() {
  using M = v1::MuonOptions;
  using A = v1::AdamWOptions;
  using S = v1::SoapOptions;
  using G = v1::GroupOverrides;
  return {
      // Muon: work, scale and moments.
      Muon(
          "muon: num_ns_steps 10^8", [](M& o) { o.set_num_ns_steps(100000000); },
          "num_ns_steps = 100000000 must be <= 100"),
      Muon(
          "muon: num_ns_steps 0", [](M& o) { o.set_num_ns_steps(0); }, "num_ns_steps = 0"),
      Muon(
          "muon: lr 1e30", [](M& o) { o.set_lr(1e30); }, "lr = 1e+30 must be"),
      Muon(
          "muon: lr NaN", [](M& o) { o.set_lr(kNaN); }, "lr = nan must be finite"),
      Muon(
          "muon: negative lr", [](M& o) { o.set_lr(-0.1); }, "lr = -0.1 must be"),
      Muon(
          "muon: weight_decay infinite", [](M& o) { o.set_weight_decay(kInf); },
          "weight_decay = inf must be finite"),
      Muon(
          "muon: momentum 1", [](M& o) { o.set_momentum(1.0); }, "momentum = 1 must be in [0, 1)"),
      Muon(
          "muon: ns_eps 0", [](M& o) { o.set_ns_eps(0); }, "ns_eps = 0 must be"),
      Muon(
          "muon: extra_scale_factor 1e9", [](M& o) { o.set_extra_scale_factor(1e9); },
          "extra_scale_factor = 1e+09"),
      Muon(
          "muon: unknown coefficient_type", [](M& o) { o.set_coefficient_type("cubic9"); },
          "cubic9"),
      Muon(
          "muon: custom without coefficients", [](M& o) { o.set_coefficient_type("custom"); },
          "custom"),
      Muon(
          "muon: custom coefficients not in triples",
          [](M& o) {
            o.set_coefficient_type("custom");
            for (int i = 0; i < 4; ++i) o.add_custom_coefficients(1.0);
          },
          "custom_coefficients"),
      Muon(
          "muon: 101 rows of custom coefficients",
          [](M& o) {
            o.set_coefficient_type("custom");
            for (int i = 0; i < 303; ++i) o.add_custom_coefficients(1.0);
          },
          "101"),
      Muon(
          "muon: unknown scale_mode", [](M& o) { o.set_scale_mode("huge"); }, "huge"),
      Muon(
          "muon: unknown fp32_matmul_prec", [](M& o) { o.set_fp32_matmul_prec("lowest"); },
          "lowest"),
      Muon(
          "muon: unknown weight_decay_mode",
          [](M& o) { o.set_weight_decay_mode(static_cast<v1::WeightDecayMode>(42)); },
          "weight_decay_mode 42"),
      // AdamW.
      Adam(
          "adamw: beta1 1", [](A& o) { o.set_beta1(1.0); }, "beta1 = 1 must be in [0, 1)"),
      Adam(
          "adamw: negative beta2", [](A& o) { o.set_beta2(-0.5); }, "beta2 = -0.5"),
      Adam(
          "adamw: eps 0", [](A& o) { o.set_eps(0); }, "eps = 0 must be"),
      Adam(
          "adamw: eps NaN", [](A& o) { o.set_eps(kNaN); }, "eps = nan"),
      Adam(
          "adamw: weight_decay 1e4", [](A& o) { o.set_weight_decay(1e4); },
          "weight_decay = 10000 must be <= 1000"),
      // SGD and Lion.
      Single<v1::SgdOptions>(
          "sgd: nesterov without momentum", "sgd", &v1::SubOptimizer::mutable_sgd,
          [](v1::SgdOptions& o) { o.set_nesterov(true); }, "nesterov"),
      Single<v1::SgdOptions>(
          "sgd: momentum 1.5", "sgd", &v1::SubOptimizer::mutable_sgd,
          [](v1::SgdOptions& o) { o.set_momentum(1.5); }, "momentum = 1.5"),
      Single<v1::LionOptions>(
          "lion: beta1 NaN", "lion", &v1::SubOptimizer::mutable_lion,
          [](v1::LionOptions& o) { o.set_beta1(kNaN); }, "beta1 = nan"),
      Single<v1::LionOptions>(
          "lion: beta2 2", "lion", &v1::SubOptimizer::mutable_lion,
          [](v1::LionOptions& o) { o.set_beta2(2); }, "beta2 = 2"),
      // AdaptiveMuon.
      Chain(
          "adaptive_muon: unknown moment2_method",
          [](v1::OptimizerConfig& c) {
            AddSub(c, "m", "adaptive_muon")->mutable_adaptive_muon()->set_moment2_method("x3");
            AddSub(c, "a", "adamw")->mutable_adamw();
          },
          "x3"),
      Chain(
          "adaptive_muon: eps 0",
          [](v1::OptimizerConfig& c) {
            AddSub(c, "m", "adaptive_muon")->mutable_adaptive_muon()->set_eps(0);
            AddSub(c, "a", "adamw")->mutable_adamw();
          },
          "eps = 0"),
      Chain(
          "adaptive_muon: num_ns_steps 1000",
          [](v1::OptimizerConfig& c) {
            AddSub(c, "m", "adaptive_muon")
                ->mutable_adaptive_muon()
                ->mutable_muon()
                ->set_num_ns_steps(1000);
            AddSub(c, "a", "adamw")->mutable_adamw();
          },
          "num_ns_steps = 1000 must be <= 100"),
      // SOAP.
      Soap(
          "soap: precondition_frequency 0", [](S& o) { o.set_precondition_frequency(0); },
          "precondition_frequency = 0"),
      Soap(
          "soap: precondition_frequency 2e6", [](S& o) { o.set_precondition_frequency(2000000); },
          "precondition_frequency = 2000000 must be <= 1000000"),
      Soap(
          "soap: power_iter_steps 0", [](S& o) { o.set_power_iter_steps(0); },
          "power_iter_steps = 0"),
      Soap(
          "soap: power_iter_steps 10^6", [](S& o) { o.set_power_iter_steps(1000000); },
          "power_iter_steps = 1000000 must be <= 100"),
      Soap(
          "soap: shampoo_beta 1", [](S& o) { o.set_shampoo_beta(1.0); }, "shampoo_beta = 1"),
      Soap(
          "soap: unknown qr_fp32_matmul_prec", [](S& o) { o.set_qr_fp32_matmul_prec("fp8"); },
          "fp8"),
      // The chain and its routing.
      Chain(
          "chain: unknown kind", [](v1::OptimizerConfig& c) { AddSub(c, "x", "adagrad"); },
          "adagrad"),
      Chain(
          "chain: duplicate sub_optimizer name",
          [](v1::OptimizerConfig& c) {
            AddSub(c, "a", "adamw");
            AddSub(c, "a", "sgd");
          },
          "'a'"),
      Chain(
          "chain: options of another kind",
          [](v1::OptimizerConfig& c) { AddSub(c, "a", "adamw")->mutable_sgd(); },
          "options do not match kind 'adamw'"),
      Chain(
          "chain: Muon alone for a 1-D parameter",
          [](v1::OptimizerConfig& c) { AddSub(c, "m", "muon"); }, "fc.bias"),
      Chain(
          "chain: rule names an unknown sub_optimizer",
          [](v1::OptimizerConfig& c) {
            AddSub(c, "a", "adamw");
            c.add_rules()->set_sub_optimizer("nope");
          },
          "nope"),
      Override(
          "override: lr 1e30", [](G& o) { o.set_lr(1e30); }, "lr = 1e+30"),
      Override(
          "override: negative wd_mult", [](G& o) { o.set_wd_mult(-1); }, "wd_mult = -1"),
      Override(
          "override: beta1 NaN", [](G& o) { o.set_beta1(kNaN); }, "beta1 = nan"),
      Override(
          "override: eps infinite", [](G& o) { o.set_eps(kInf); }, "eps = inf"),
  };
}

}  // namespace testutil
}  // namespace optstep
