#ifndef OPTSTEP_SERVER_OPTIM_ROUTING_H_
#define OPTSTEP_SERVER_OPTIM_ROUTING_H_

// Routing of parameters to sub-optimizers and hyperparameter groups (spec §4).
//
// A parameter goes to the first RoutingRule that matches it; otherwise to the only sub-optimizer,
// or, when the chain has one Adam sub-optimizer beside the others, by the reference rule:
// 2-D parameters not flagged embedding/output go to the first non-Adam sub-optimizer and the rest
// to Adam. wd_mult is 0 for 1-D (and 0-D) parameters and names matching "*.bias", 1 otherwise,
// unless an override sets it.
//
// MuP (ChainConfig::mup_width_mult = w ≠ 1, spec §4): AdamW's hidden matrices (not rank <= 1,
// not embedding/output) get lr_mult = eps_mult = 1/w, SOAP's and Lion's lr_mult = 1/w, SGD's
// vector-like parameters lr_mult = w; Muon and AdaptiveMuon are not rescaled. The multipliers
// are overrides, so such parameters form their own groups.
//
// Groups: parameters with the same (sub-optimizer, overrides, wd_mult, expert flag) share a
// group. Groups are ordered by sub-optimizer, then the group without overrides first, then the
// others by their canonical key, so every rank builds the identical list.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"

namespace optstep {

struct ParamGroup {
  int id = 0;
  int sub_optimizer = 0;     // index into ChainConfig::sub_optimizers
  GroupOverrides overrides;  // without wd_mult
  double wd_mult = 1.0;
  bool expert = false;
  std::vector<int> param_ids;  // ascending
};

// INVALID_ARGUMENT naming the rule or parameter for: a rule naming an unknown sub-optimizer, a
// parameter that no rule and no default routes, an empty chain, duplicate sub-optimizer names,
// an invalid configuration of a sub-optimizer that no parameter reaches (the others are
// validated when their groups' optimizers are created, see registry.h) or a mup_width_mult that
// is not finite and > 0.
absl::StatusOr<std::vector<ParamGroup>> RouteParameters(const ChainConfig& chain,
                                                        const std::vector<ParamInfo>& params);

// The reference wd_mult of a parameter without overrides.
double DefaultWdMult(const ParamInfo& param);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_ROUTING_H_
