#ifndef OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_
#define OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_

// Validation helpers shared by the optimizers: each answers INVALID_ARGUMENT with a message that
// names the owner (sub-optimizer or group), the hyperparameter and its value.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/math/weight_decay.h"

namespace optstep {

// value is finite and value >= 0.
absl::Status CheckNonNegative(absl::string_view owner, absl::string_view name, double value);
// value is finite and 0 <= value < 1.
absl::Status CheckUnitInterval(absl::string_view owner, absl::string_view name, double value);
// value is finite and value > 0.
absl::Status CheckPositive(absl::string_view owner, absl::string_view name, double value);
// `mode` is one of the enumerators (a value cast from wire data may not be).
absl::Status CheckWeightDecayMode(absl::string_view owner, math::WeightDecayMode mode);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_
