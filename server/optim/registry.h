#ifndef OPTSTEP_SERVER_OPTIM_REGISTRY_H_
#define OPTSTEP_SERVER_OPTIM_REGISTRY_H_

// The optimizer registry: kind names and aliases -> factories.
//
//   adamw (alias adam)   spec §3.1
//   sgd                  spec §3.2
//
// Kinds of the v1 API that this build does not implement yet (lion, muon/dist_muon,
// adaptive_muon, soap) answer UNIMPLEMENTED; anything else is INVALID_ARGUMENT.

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
// kind has no use for (e.g. beta1 for sgd).
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(absl::string_view owner,
                                                           const SubOptimizerConfig& config,
                                                           const GroupOverrides& overrides);

// Canonical kinds this build implements, sorted.
std::vector<std::string> ImplementedOptimizerKinds();

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_REGISTRY_H_
