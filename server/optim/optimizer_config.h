#ifndef OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_
#define OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_

// The optimizer chain of a session, in engine terms (server/rpc converts the proto into these).
// Defaults are the library defaults of docs/spec/optimizers.md §3.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/math/weight_decay.h"

namespace optstep {

using WeightDecayMode = math::WeightDecayMode;

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;
  bool bias_correction = true;
};

struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// Lion (spec §3.3); library defaults.
struct LionConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.01;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
};

// Muon (spec §3.4); library defaults. Names are validated when the optimizer is created.
struct MuonConfig {
  double lr = 3e-4;
  double momentum = 0.95;
  bool nesterov = false;
  double weight_decay = 0.01;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  std::string coefficient_type = "quintic";  // simple, quintic, polar_express, aol, custom
  std::vector<double> custom_coefficients;   // (a, b, c) triples, flattened; for "custom"
  int64_t num_ns_steps = 5;
  std::string scale_mode = "spectral";  // spectral, shape_scaling, unit_rms_norm
  double extra_scale_factor = 1.0;
  std::string fp32_matmul_prec = "medium";  // highest, high, medium
  bool split_qkv = true;
  double ns_eps = 1e-7;
  // false: the identity instead of Newton–Schulz and no scale (O = u). For tests of the
  // momentum algebra (spec §9.1); not reachable through the API.
  bool orthogonalize = true;
};

// AdaptiveMuon (spec §3.5): Muon + a second moment.
struct AdaptiveMuonConfig {
  MuonConfig muon;
  std::string moment2_method = "adamuon";  // adamuon, normuon
  double beta2 = 0.95;
  double eps = 1e-8;
};

// SOAP (spec §3.6); library defaults.
struct SoapConfig {
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double shampoo_beta = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  bool nesterov = false;
  int64_t precondition_frequency = 1;
  int64_t warmup_steps = 0;
  bool correct_bias = true;
  std::optional<bool> correct_shampoo_beta_bias;  // unset: correct_bias
  bool use_kl_shampoo = false;
  std::string fp32_matmul_prec = "high";
  std::string qr_fp32_matmul_prec = "high";
  bool use_eigh = false;  // eigh at every refresh instead of power iteration + QR
  int64_t power_iter_steps = 1;
  bool use_adaptive_criteria = false;
  double adaptive_update_tolerance = 1e-7;
  double max_update_rms = 0.0;
};

// One sub-optimizer: `kind` selects the registry entry, whose config struct is used.
struct SubOptimizerConfig {
  std::string name;  // unique in the chain
  std::string kind;  // registry name or alias
  AdamWConfig adamw;
  SgdConfig sgd;
  LionConfig lion;
  MuonConfig muon;
  AdaptiveMuonConfig adaptive_muon;
  SoapConfig soap;
};

// Per-group differences from the sub-optimizer's config.
struct GroupOverrides {
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> wd_mult;
  std::optional<double> beta1;
  std::optional<double> beta2;
  std::optional<double> eps;
  std::optional<double> momentum;
  // MuP (spec §4): set by the routing for the parameters the width multiplier rescales, never
  // by rules. lr_mult multiplies every step's learning rate; eps_mult the optimizer's eps.
  std::optional<double> lr_mult;
  std::optional<double> eps_mult;

  bool empty() const {
    return !lr && !weight_decay && !wd_mult && !beta1 && !beta2 && !eps && !momentum && !lr_mult &&
           !eps_mult;
  }
  // A canonical text form, used to order and identify groups.
  std::string Key() const;
};

// Routes parameters: every condition that is set must hold; the first matching rule wins.
struct RoutingRule {
  std::string name_glob;  // empty: any name
  std::optional<int> ndim;
  std::optional<bool> embedding_or_output;
  std::string sub_optimizer;  // SubOptimizerConfig::name
  GroupOverrides overrides;
};

struct ChainConfig {
  std::vector<SubOptimizerConfig> sub_optimizers;
  std::vector<RoutingRule> rules;
  double clip_grad = 1.0;       // <= 0 disables clipping
  double mup_width_mult = 1.0;  // MuP width multiplier (spec §4); 1 changes nothing
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_
