#ifndef OPTSTEP_SERVER_OPTIM_PRESETS_H_
#define OPTSTEP_SERVER_OPTIM_PRESETS_H_

// Megatron-parity presets (spec Appendix A): `--optimizer X` as a chain, with Megatron-style
// argument names overriding preset values.
//
//   adam  AdamW (0.9, 0.999), eps 1e-8, wd 0.01 for every parameter; clip 1.0
//   sgd   SGD momentum 0.9, coupled wd 0.01 for every parameter; clip 1.0
//
// Accepted arguments: lr, weight_decay, clip_grad, adam_beta1, adam_beta2, adam_eps,
// sgd_momentum. The emerging-optimizer presets (muon, dist_muon, adaptive_muon, soap, lion)
// are UNIMPLEMENTED in this build.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// INVALID_ARGUMENT for unknown presets, unknown or unparsable arguments (naming them).
absl::StatusOr<ChainConfig> ExpandPreset(const std::string& preset,
                                         const std::map<std::string, std::string>& args);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_PRESETS_H_
