#ifndef OPTSTEP_SERVER_OPTIM_REGISTRY_H_
#define OPTSTEP_SERVER_OPTIM_REGISTRY_H_

// The optimizer registry: kind names and aliases -> factories.
//
//   adamw (alias adam)        spec §3.1
//   sgd                       spec §3.2
//   lion                      spec §3.3
//   muon (alias dist_muon)    spec §3.4 (dist_muon is deprecated)
//   adaptive_muon             spec §3.5
//   soap                      spec §3.6
//
// Anything else is INVALID_ARGUMENT. Group overrides a kind accepts besides lr and weight_decay:
// adamw beta1/beta2/eps, sgd momentum, lion beta1/beta2, muon momentum, adaptive_muon
// momentum/beta2/eps, soap beta1/beta2/eps. lr_mult (MuP) wraps any optimizer so that every
// step's lr is multiplied; eps_mult multiplies eps where the kind has one.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// The canonical kind of `kind` ("adam" -> "adamw"). `owner` names the sub-optimizer in errors.
absl::StatusOr<std::string> CanonicalOptimizerKind(absl::string_view owner, absl::string_view kind);

// Creates the optimizer of one parameter group: the sub-optimizer's config with the group's
// overrides applied. INVALID_ARGUMENT (naming `owner`) for invalid values and for overrides the
// kind has no use for (e.g. beta1 for sgd). Every factory validates its whole configuration, so
// creating with empty overrides validates a sub-optimizer.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(absl::string_view owner,
                                                           const SubOptimizerConfig& config,
                                                           const GroupOverrides& overrides);

// Canonical kinds this build implements, sorted.
std::vector<std::string> ImplementedOptimizerKinds();

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_REGISTRY_H_
