#ifndef OPTSTEP_KERNELS_MATH_WEIGHT_DECAY_H_
#define OPTSTEP_KERNELS_MATH_WEIGHT_DECAY_H_

// Weight-decay modes of docs/spec/optimizers.md §2 as one per-element rule shared by the CPU loops
// and the CUDA kernels. The host folds the mode, η and λ into a WeightDecay once per step.

#include "kernels/math/host_device.h"

namespace optstep {
namespace math {

// spec §2. No mode does anything when λ == 0 exactly.
enum class WeightDecayMode : int {
  kDecoupled = 0,    // p ← p − (η·λ)·p
  kIndependent = 1,  // p ← p − λ·p
  kL2 = 2,           // g ← g + λ·p (the gradient the moments see)
  kPalm = 3,         // p ← p − (λ·η²)·p (Emerging-Optimizers v0.3.0 extension)
};

// One step's decay: `l2` adds coef·p to the gradient; otherwise p ← p + coef·p (coef ≤ 0).
struct WeightDecay {
  float coef = 0.0f;
  bool l2 = false;
};

// Host side: the products (η·λ, λ·η²) are formed in double and rounded once, then negated.
inline WeightDecay MakeWeightDecay(WeightDecayMode mode, double lr, double lambda) {
  WeightDecay d;
  if (lambda == 0.0) return d;
  switch (mode) {
    case WeightDecayMode::kDecoupled:
      d.coef = -static_cast<float>(lr * lambda);
      break;
    case WeightDecayMode::kIndependent:
      d.coef = -static_cast<float>(lambda);
      break;
    case WeightDecayMode::kL2:
      d.coef = static_cast<float>(lambda);
      d.l2 = true;
      break;
    case WeightDecayMode::kPalm:
      d.coef = -static_cast<float>(lambda * lr * lr);
      break;
  }
  return d;
}

// g + λ·p in L2 mode, g otherwise. `p` is the pre-update parameter.
OPTSTEP_HD float DecayedGradient(const WeightDecay& d, float g, float p) {
  return d.l2 ? g + d.coef * p : g;
}

// p ← p + coef·p in the parameter modes (a no-op for coef == 0 and in L2 mode). A select, not a
// branch around the store, so that the loops vectorize.
OPTSTEP_HD void DecayParam(const WeightDecay& d, float& p) {
  const float decayed = p + d.coef * p;
  p = (!d.l2 && d.coef != 0.0f) ? decayed : p;
}

}  // namespace math
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATH_WEIGHT_DECAY_H_
