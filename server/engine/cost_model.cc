#include "server/engine/cost_model.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"
#include "server/optim/routing.h"

namespace optstep {
namespace {

// Calls `fn(optimizer, param id)` for every parameter with its group's optimizer, once that
// optimizer accepted the parameter (Optimizer::CheckParam): the estimates may read any dimension
// the optimizer needs.
absl::Status ForEachParam(const ChainConfig& chain, const std::vector<ParamInfo>& params,
                          const std::function<void(const Optimizer&, int)>& fn) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> groups, RouteParameters(chain, params));
  for (const ParamGroup& group : groups) {
    const SubOptimizerConfig& sub = chain.sub_optimizers[group.sub_optimizer];
    OPTSTEP_ASSIGN_OR_RETURN(
        std::unique_ptr<Optimizer> optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", group.id, ")"), sub,
                        group.overrides));
    for (int p : group.param_ids) {
      OPTSTEP_RETURN_IF_ERROR(optimizer->CheckParam(params[p]));
      fn(*optimizer, p);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<double>> EstimateStepCosts(const ChainConfig& chain,
                                                      const std::vector<ParamInfo>& params) {
  std::vector<double> costs(params.size(), 0.0);
  OPTSTEP_RETURN_IF_ERROR(ForEachParam(chain, params, [&](const Optimizer& optimizer, int p) {
    costs[p] = optimizer.EstimateStepCost(params[p]);
  }));
  return costs;
}

absl::StatusOr<std::vector<int64_t>> EstimateOwnedBytes(const ChainConfig& chain,
                                                        const std::vector<ParamInfo>& params) {
  std::vector<int64_t> bytes(params.size(), 0);
  // The partition adds them up in int64 (checkpoint/partition.h): clamped so that every sum stays
  // within 2^62, whatever a caller declares (a parameter has at most 2^40 elements, so one term
  // cannot overflow; hundreds of thousands of SOAP factors of 2^20 x 2^20 would add up past
  // 2^63). A session that large is refused by its footprint, computed with saturating sums.
  const int64_t most = (int64_t{1} << 62) / std::max<int64_t>(1, params.size());
  OPTSTEP_RETURN_IF_ERROR(ForEachParam(chain, params, [&](const Optimizer& optimizer, int p) {
    bytes[p] = std::min(params[p].numel() * 8 + optimizer.StateBytes(params[p]), most);
  }));
  return bytes;
}

}  // namespace optstep
