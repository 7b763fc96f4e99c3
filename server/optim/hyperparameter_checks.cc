#include "server/optim/hyperparameter_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

absl::Status Invalid(absl::string_view owner, absl::string_view name, double value,
                     absl::string_view requirement) {
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": ", name, " = ", value, " must be ", requirement));
}

// OK when value <= max; otherwise names the bound.
absl::Status CheckAtMost(absl::string_view owner, absl::string_view name, double value,
                         double max) {
  if (value <= max) return absl::OkStatus();
  return Invalid(owner, name, value, absl::StrCat("<= ", max));
}

}  // namespace

absl::Status CheckNonNegative(absl::string_view owner, absl::string_view name, double value,
                              double max) {
  if (!std::isfinite(value) || value < 0.0) return Invalid(owner, name, value, "finite and >= 0");
  return CheckAtMost(owner, name, value, max);
}

absl::Status CheckUnitInterval(absl::string_view owner, absl::string_view name, double value) {
  if (std::isfinite(value) && value >= 0.0 && value < 1.0) return absl::OkStatus();
  return Invalid(owner, name, value, "in [0, 1)");
}

absl::Status CheckPositive(absl::string_view owner, absl::string_view name, double value,
                           double max) {
  if (!std::isfinite(value) || value <= 0.0) return Invalid(owner, name, value, "finite and > 0");
  return CheckAtMost(owner, name, value, max);
}

absl::Status CheckInRange(absl::string_view owner, absl::string_view name, double value, double min,
                          double max) {
  if (std::isfinite(value) && value >= min && value <= max) return absl::OkStatus();
  return Invalid(owner, name, value, absl::StrCat("finite and in [", min, ", ", max, "]"));
}

absl::Status CheckCount(absl::string_view owner, absl::string_view name, int64_t value, int64_t min,
                        int64_t max) {
  if (value < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": ", name, " = ", value, " must be >= ", min));
  }
  if (value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": ", name, " = ", value, " must be <= ", max));
  }
  return absl::OkStatus();
}

absl::Status CheckLearningRate(absl::string_view owner, double lr) {
  return CheckNonNegative(owner, "lr", lr, kMaxLearningRate);
}

absl::Status CheckWeightDecay(absl::string_view owner, double weight_decay) {
  return CheckNonNegative(owner, "weight_decay", weight_decay, kMaxWeightDecay);
}

absl::Status CheckEps(absl::string_view owner, absl::string_view name, double eps) {
  return CheckPositive(owner, name, eps, kMaxEps);
}

absl::Status CheckWeightDecayMode(absl::string_view owner, math::WeightDecayMode mode) {
  const int value = static_cast<int>(mode);
  if (value >= 0 && value <= 3) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": weight_decay_mode ", value, " is not a known mode"));
}

}  // namespace optstep
