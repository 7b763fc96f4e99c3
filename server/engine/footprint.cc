#include "server/engine/footprint.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"
#include "server/optim/routing.h"
#include "server/optim/workspace.h"

namespace optstep {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;

// a + b, saturating at kMaxBytes. REQUIRES: a, b >= 0.
int64_t Add(int64_t a, int64_t b) {
  return std::min(kMaxBytes, std::min(a, kMaxBytes) + std::min(b, kMaxBytes));
}

}  // namespace

int64_t SessionFootprint::total() const {
  return Add(Add(Add(masters, state), Add(gradients, overhead)), Add(workspace, shadow));
}

std::string SessionFootprint::Breakdown() const {
  return absl::StrCat("masters ", masters, ", optimizer state ", state, ", gradients ", gradients,
                      ", overhead ", overhead, ", workspace ", workspace,
                      shadow > 0 ? absl::StrCat(", shadow ", shadow) : "");
}

absl::StatusOr<SessionFootprint> ComputeFootprint(const SessionConfig& config, const Layout& layout,
                                                  int rank, bool state_redundancy) {
  const int world = layout.world_size;
  const int shadowed = state_redundancy && world > 1 ? (rank + world - 1) % world : -1;
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> groups,
                           RouteParameters(config.chain, config.params));
  SessionFootprint f;
  const bool all_masters = config.storage == ParameterStorage::kReplicated;
  for (size_t p = 0; p < config.params.size(); ++p) {
    if (all_masters || layout.owner[p] == rank) {
      f.masters = Add(f.masters, config.params[p].numel() * 4);
    }
  }
  int64_t owned = 0;  // parameters
  for (const ParamGroup& group : groups) {
    const SubOptimizerConfig& sub = config.chain.sub_optimizers[group.sub_optimizer];
    OPTSTEP_ASSIGN_OR_RETURN(
        std::unique_ptr<Optimizer> optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", group.id, ")"), sub,
                        group.overrides));
    WorkspacePlan plan;
    for (int p : group.param_ids) {
      const ParamInfo& param = config.params[p];
      OPTSTEP_RETURN_IF_ERROR(optimizer->CheckParam(param));
      if (layout.owner[p] == shadowed) {
        // The shadow's master, state and gradient buffer (its update uses the same workspace).
        f.shadow = Add(f.shadow, Add(optimizer->StateBytes(param), param.numel() * 8));
        optimizer->PlanWorkspace(param, plan);
      }
      if (layout.owner[p] != rank) continue;
      ++owned;
      f.state = Add(f.state, optimizer->StateBytes(param));
      f.gradients = Add(f.gradients, param.numel() * 4);
      optimizer->PlanWorkspace(param, plan);
    }
    f.workspace = Add(f.workspace, plan.bytes());
  }
  const int64_t num_params = static_cast<int64_t>(config.params.size());
  f.host_bytes = kSessionOverheadBytes + num_params * kParamOverheadBytes;
  if (config.mode == GradientMode::kReplicated && config.num_trainers > 1) {
    f.host_bytes = Add(f.host_bytes, owned * config.num_trainers * kTrainerParamRecordBytes);
  }
  for (const ParamInfo& param : config.params) {
    f.host_bytes += kParamNameCopies * static_cast<int64_t>(param.name.size());
  }
  // The ranks' votes on a step (StepCoordinator): a float64 per parameter and three more.
  const int64_t votes = layout.world_size > 1 ? (num_params + 3) * 8 : 0;
  f.overhead = f.host_bytes + votes;
  return f;
}

}  // namespace optstep
