#include "server/engine/cost_model.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"
#include "server/optim/routing.h"

namespace optstep {

absl::StatusOr<std::vector<double>> EstimateStepCosts(const ChainConfig& chain,
                                                      const std::vector<ParamInfo>& params) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> groups, RouteParameters(chain, params));
  std::vector<double> costs(params.size(), 0.0);
  for (const ParamGroup& group : groups) {
    const SubOptimizerConfig& sub = chain.sub_optimizers[group.sub_optimizer];
    OPTSTEP_ASSIGN_OR_RETURN(
        std::unique_ptr<Optimizer> optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", group.id, ")"), sub,
                        group.overrides));
    for (int p : group.param_ids) costs[p] = optimizer->EstimateStepCost(params[p]);
  }
  return costs;
}

}  // namespace optstep
