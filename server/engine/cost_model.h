#ifndef OPTSTEP_SERVER_ENGINE_COST_MODEL_H_
#define OPTSTEP_SERVER_ENGINE_COST_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"

namespace optstep {

// The estimated step cost of every parameter under `chain` (routing of spec §4, then each
// group's Optimizer::EstimateStepCost): what the layer-wise partitioner balances.
// INVALID_ARGUMENT as RouteParameters / CreateOptimizer for invalid chains, and as
// Optimizer::CheckParam, naming the parameter, for one its optimizer cannot handle.
absl::StatusOr<std::vector<double>> EstimateStepCosts(const ChainConfig& chain,
                                                      const std::vector<ParamInfo>& params);

// The owned bytes of every parameter under `chain`: what its owner alone keeps of it, the fp32
// master and gradient buffer (4 bytes per element each) and the optimizer state
// (Optimizer::StateBytes); the partitioner's memory load. Errors as EstimateStepCosts.
absl::StatusOr<std::vector<int64_t>> EstimateOwnedBytes(const ChainConfig& chain,
                                                        const std::vector<ParamInfo>& params);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_COST_MODEL_H_
