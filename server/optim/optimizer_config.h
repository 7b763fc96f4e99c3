#ifndef OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_
#define OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_

// The optimizer chain of a session, in engine terms (server/rpc converts the proto into these).
// Defaults are the library defaults of spec/optimizers.md §3.

#include <optional>
#include <string>
#include <vector>

namespace optstep {

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

// One sub-optimizer: `kind` selects the registry entry, whose config struct is used.
struct SubOptimizerConfig {
  std::string name;  // unique in the chain
  std::string kind;  // registry name or alias
  AdamWConfig adamw;
  SgdConfig sgd;
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

  bool empty() const {
    return !lr && !weight_decay && !wd_mult && !beta1 && !beta2 && !eps && !momentum;
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
  double clip_grad = 1.0;  // <= 0 disables clipping
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_OPTIMIZER_CONFIG_H_
