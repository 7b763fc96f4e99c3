#ifndef OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_
#define OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_

// Validation helpers shared by the optimizers and the step schedule: each answers
// INVALID_ARGUMENT with a message that names the owner (sub-optimizer or group), the
// hyperparameter, its value and the bound it breaks.
//
// The bounds below are the table "Bounds checked at creation" of docs/spec/optimizers.md §3:
// generous for real use, tight enough that no value makes one step's work or one update's size
// absurd (a session must not be able to occupy its rank's device for hours, nor blow its
// parameters to infinity in one step).

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/math/weight_decay.h"

namespace optstep {

// lr, at creation, in a group override and in a step's schedule: [0, kMaxLearningRate].
inline constexpr double kMaxLearningRate = 1e3;
// weight_decay, likewise: [0, kMaxWeightDecay]; also the bound of a rule's wd_mult.
inline constexpr double kMaxWeightDecay = 1e3;
// eps of AdamW, AdaptiveMuon and SOAP, and Muon's ns_eps: (0, kMaxEps].
inline constexpr double kMaxEps = 1.0;
// Muon's extra_scale_factor: (0, kMaxScaleFactor].
inline constexpr double kMaxScaleFactor = 1e3;
// The MuP width multiplier: [1 / kMaxWidthMult, kMaxWidthMult].
inline constexpr double kMaxWidthMult = 1e3;
// Newton–Schulz iterations per orthogonalization (Muon, AdaptiveMuon; every coefficient type)
// and rows of a custom coefficient table: [1, kMaxNsSteps].
inline constexpr int64_t kMaxNsSteps = 100;
// SOAP power-iteration steps per basis refresh: [1, kMaxPowerIterSteps].
inline constexpr int64_t kMaxPowerIterSteps = 100;
// SOAP precondition_frequency: [1, kMaxPreconditionFrequency].
inline constexpr int64_t kMaxPreconditionFrequency = 1000000;

// value is finite and 0 <= value <= max.
absl::Status CheckNonNegative(absl::string_view owner, absl::string_view name, double value,
                              double max = std::numeric_limits<double>::infinity());
// value is finite and 0 <= value < 1.
absl::Status CheckUnitInterval(absl::string_view owner, absl::string_view name, double value);
// value is finite and 0 < value <= max.
absl::Status CheckPositive(absl::string_view owner, absl::string_view name, double value,
                           double max = std::numeric_limits<double>::infinity());
// value is finite and min <= value <= max.
absl::Status CheckInRange(absl::string_view owner, absl::string_view name, double value, double min,
                          double max);
// min <= value <= max, for counts (iterations, frequencies).
absl::Status CheckCount(absl::string_view owner, absl::string_view name, int64_t value, int64_t min,
                        int64_t max);
// lr in [0, kMaxLearningRate].
absl::Status CheckLearningRate(absl::string_view owner, double lr);
// weight_decay in [0, kMaxWeightDecay].
absl::Status CheckWeightDecay(absl::string_view owner, double weight_decay);
// eps in (0, kMaxEps], named `name`.
absl::Status CheckEps(absl::string_view owner, absl::string_view name, double eps);
// `mode` is one of the enumerators (a value cast from wire data may not be).
absl::Status CheckWeightDecayMode(absl::string_view owner, math::WeightDecayMode mode);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_HYPERPARAMETER_CHECKS_H_
