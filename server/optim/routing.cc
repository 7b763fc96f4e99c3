#include "server/optim/routing.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/hyperparameter_checks.h"
#include "server/optim/registry.h"

namespace optstep {
namespace {

bool RuleMatches(const RoutingRule& rule, const ParamInfo& param) {
  if (!rule.name_glob.empty() &&
      fnmatch(rule.name_glob.c_str(), param.name.c_str(), /*flags=*/0) != 0) {
    return false;
  }
  if (rule.ndim && *rule.ndim != param.ndim()) return false;
  if (rule.embedding_or_output && *rule.embedding_or_output != param.embedding_or_output) {
    return false;
  }
  return true;
}

// Sub-optimizer index by the default rule, or -1.
int DefaultRoute(const ChainConfig& chain, const std::vector<std::string>& kinds,
                 const ParamInfo& param) {
  if (chain.sub_optimizers.size() == 1) return 0;
  int adam = -1;
  int matrix = -1;
  for (int i = 0; i < static_cast<int>(kinds.size()); ++i) {
    if (kinds[i] == "adamw") {
      if (adam < 0) adam = i;
    } else if (matrix < 0) {
      matrix = i;
    }
  }
  if (adam < 0 || matrix < 0) return -1;
  return (param.ndim() == 2 && !param.embedding_or_output) ? matrix : adam;
}

// MuP (spec §4): the learning-rate / eps multipliers of `param` under the width multiplier `w`.
// "Vector-like": rank <= 1 or flagged embedding/output.
void ApplyMup(double w, const std::string& kind, const ParamInfo& param, GroupOverrides& o) {
  if (w == 1.0) return;
  const bool vector_like = param.ndim() <= 1 || param.embedding_or_output;
  if (kind == "adamw" && !vector_like) {
    o.lr_mult = 1.0 / w;
    o.eps_mult = 1.0 / w;
  } else if (kind == "sgd" && vector_like) {
    o.lr_mult = w;
  } else if ((kind == "soap" || kind == "lion") && !vector_like) {
    o.lr_mult = 1.0 / w;
  }
  // Muon and AdaptiveMuon: their matrices are excluded; they rely on scale_mode.
}

}  // namespace

double DefaultWdMult(const ParamInfo& param) {
  return (param.ndim() <= 1 || absl::EndsWith(param.name, ".bias")) ? 0.0 : 1.0;
}

absl::StatusOr<std::vector<ParamGroup>> RouteParameters(const ChainConfig& chain,
                                                        const std::vector<ParamInfo>& params) {
  if (chain.sub_optimizers.empty()) {
    return absl::InvalidArgumentError("optimizer: the chain has no sub-optimizer");
  }
  std::map<std::string, int> index_of;
  std::vector<std::string> kinds;
  for (int i = 0; i < static_cast<int>(chain.sub_optimizers.size()); ++i) {
    const SubOptimizerConfig& sub = chain.sub_optimizers[i];
    if (sub.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: sub_optimizer ", i, " has no name"));
    }
    if (!index_of.emplace(sub.name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: duplicate sub_optimizer name '", sub.name, "'"));
    }
    OPTSTEP_ASSIGN_OR_RETURN(
        std::string kind,
        CanonicalOptimizerKind(absl::StrCat("sub_optimizer '", sub.name, "'"), sub.kind));
    kinds.push_back(kind);
  }
  const double mup = chain.mup_width_mult;
  OPTSTEP_RETURN_IF_ERROR(
      CheckInRange("optimizer", "mup_width_mult", mup, 1.0 / kMaxWidthMult, kMaxWidthMult));
  for (int r = 0; r < static_cast<int>(chain.rules.size()); ++r) {
    if (index_of.count(chain.rules[r].sub_optimizer) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer: rule ", r,
                                                     " routes to unknown sub_optimizer '",
                                                     chain.rules[r].sub_optimizer, "'"));
    }
    if (chain.rules[r].overrides.wd_mult) {
      OPTSTEP_RETURN_IF_ERROR(CheckNonNegative(absl::StrCat("optimizer: rule ", r), "wd_mult",
                                               *chain.rules[r].overrides.wd_mult, kMaxWeightDecay));
    }
  }

  // (sub_optimizer, has overrides, overrides key, wd_mult, expert) -> group.
  using Key = std::tuple<int, bool, std::string, double, bool>;
  std::map<Key, ParamGroup> groups;
  for (int p = 0; p < static_cast<int>(params.size()); ++p) {
    const ParamInfo& param = params[p];
    int sub = -1;
    GroupOverrides overrides;
    for (const RoutingRule& rule : chain.rules) {
      if (RuleMatches(rule, param)) {
        sub = index_of.at(rule.sub_optimizer);
        overrides = rule.overrides;
        break;
      }
    }
    if (sub < 0) sub = DefaultRoute(chain, kinds, param);
    if (sub < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param '", param.name, "': no routing rule matches and the chain has no default route"));
    }
    const double wd_mult = overrides.wd_mult.value_or(DefaultWdMult(param));
    overrides.wd_mult.reset();
    ApplyMup(mup, kinds[sub], param, overrides);
    Key key{sub, !overrides.empty(), overrides.Key(), wd_mult, param.expert};
    ParamGroup& group = groups[key];
    group.sub_optimizer = sub;
    group.overrides = overrides;
    group.wd_mult = wd_mult;
    group.expert = param.expert;
    group.param_ids.push_back(p);
  }
  // Sub-optimizers that no parameter reaches are validated here; the others when their groups'
  // optimizers are created (with the group in the message).
  std::vector<bool> used(chain.sub_optimizers.size(), false);
  for (const auto& entry : groups) used[entry.second.sub_optimizer] = true;
  for (size_t i = 0; i < used.size(); ++i) {
    if (used[i]) continue;
    const SubOptimizerConfig& sub = chain.sub_optimizers[i];
    OPTSTEP_RETURN_IF_ERROR(
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "'"), sub, GroupOverrides{})
            .status());
  }
  std::vector<ParamGroup> result;
  for (auto& entry : groups) {
    entry.second.id = static_cast<int>(result.size());
    result.push_back(std::move(entry.second));
  }
  return result;
}

}  // namespace optstep
