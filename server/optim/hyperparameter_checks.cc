#include "server/optim/hyperparameter_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace optstep {

absl::Status CheckNonNegative(absl::string_view owner, absl::string_view name, double value) {
  if (std::isfinite(value) && value >= 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": ", name, " = ", value, " must be finite and >= 0"));
}

absl::Status CheckUnitInterval(absl::string_view owner, absl::string_view name, double value) {
  if (std::isfinite(value) && value >= 0.0 && value < 1.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": ", name, " = ", value, " must be in [0, 1)"));
}

absl::Status CheckPositive(absl::string_view owner, absl::string_view name, double value) {
  if (std::isfinite(value) && value > 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": ", name, " = ", value, " must be finite and > 0"));
}

absl::Status CheckWeightDecayMode(absl::string_view owner, math::WeightDecayMode mode) {
  const int value = static_cast<int>(mode);
  if (value >= 0 && value <= 3) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": weight_decay_mode ", value, " is not a known mode"));
}

}  // namespace optstep
