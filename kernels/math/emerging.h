#ifndef OPTSTEP_KERNELS_MATH_EMERGING_H_
#define OPTSTEP_KERNELS_MATH_EMERGING_H_

// Per-element parts of Lion, Muon, AdaptiveMuon and SOAP (docs/spec/optimizers.md §3.3-3.6): the
// single source of truth for the CPU loops (kernels/cpu) and the CUDA kernels (kernels/cuda). Every
// value is fp32; scalars are prepared once per step on the host (in double, rounded once).

#include <cmath>

#include "kernels/math/host_device.h"
#include "kernels/math/weight_decay.h"

namespace optstep {
namespace math {

// sign(x): +1, −1, or 0 for ±0 (spec §1.1). Branch-free, so that the loops vectorize.
OPTSTEP_HD float Sign(float x) {
  return static_cast<float>(x > 0.0f) - static_cast<float>(x < 0.0f);
}

// ---- Lion (spec §3.3) -------------------------------------------------------------------------

struct LionArgs {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.99f;
  float one_minus_beta2 = 0.01f;
  WeightDecay decay;
  // The gradient is used as g · grad_scale, as in AdamWArgs: the clip coefficient, in (0, 1].
  float grad_scale = 1.0f;
};

inline LionArgs MakeLionArgs(double lr, double beta1, double beta2, WeightDecayMode mode,
                             double lambda) {
  LionArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(beta1);
  a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  a.beta2 = static_cast<float>(beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.decay = MakeWeightDecay(mode, lr, lambda);
  return a;
}

// Decay first; the sign of the β1 interpolation moves p; the state is updated with β2.
OPTSTEP_HD void LionElement(const LionArgs& a, float g, float& p, float& m) {
  g = g * a.grad_scale;
  g = DecayedGradient(a.decay, g, p);
  DecayParam(a.decay, p);
  const float c = a.beta1 * m + a.one_minus_beta1 * g;
  m = a.beta2 * m + a.one_minus_beta2 * g;
  p = p - a.lr * Sign(c);
}

// ---- Muon / AdaptiveMuon momentum (spec §3.4.2) -----------------------------------------------

struct MuonMomentumArgs {
  float momentum = 0.95f;
  float one_minus_momentum = 0.05f;
  bool nesterov = false;
  WeightDecay decay;
};

inline MuonMomentumArgs MakeMuonMomentumArgs(double momentum, bool nesterov, WeightDecayMode mode,
                                             double lr, double lambda) {
  MuonMomentumArgs a;
  a.momentum = static_cast<float>(momentum);
  a.one_minus_momentum = static_cast<float>(1.0 - momentum);
  a.nesterov = nesterov;
  a.decay = MakeWeightDecay(mode, lr, lambda);
  return a;
}

// Decay first, then the EMA b ← μ·b + (1−μ)·g; `u` receives the matrix to orthogonalize.
OPTSTEP_HD void MuonMomentumElement(const MuonMomentumArgs& a, float g, float& p, float& b,
                                    float& u) {
  g = DecayedGradient(a.decay, g, p);
  DecayParam(a.decay, p);
  b = a.momentum * b + a.one_minus_momentum * g;
  u = a.nesterov ? a.one_minus_momentum * g + a.momentum * b : b;
}

// ---- AdaptiveMuon second moments (spec §3.5) --------------------------------------------------

struct Moment2Args {
  float lr = 0.0f;  // adamuon only
  float beta2 = 0.95f;
  float one_minus_beta2 = 0.05f;
  float eps = 1e-8f;
  float count = 1.0f;  // normuon: elements averaged per moment entry
};

inline Moment2Args MakeMoment2Args(double lr, double beta2, double eps, long long count) {
  Moment2Args a;
  a.lr = static_cast<float>(lr);
  a.beta2 = static_cast<float>(beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.eps = static_cast<float>(eps);
  a.count = static_cast<float>(count);
  return a;
}

// adamuon: v ← β2·v + (1−β2)·o²; p ← p − η·o/(√v + ε) (ε outside the root).
OPTSTEP_HD void AdamuonElement(const Moment2Args& a, float o, float& p, float& v) {
  v = a.beta2 * v + a.one_minus_beta2 * o * o;
  p = p - a.lr * (o / (sqrtf(v) + a.eps));
}

// normuon, one moment entry: `sum_squares` of its row or column; v ← β2·v + (1−β2)·mean;
// `scale` receives 1/√max(v, ε) (ε clamps v).
OPTSTEP_HD void NormuonMomentElement(const Moment2Args& a, float sum_squares, float& v,
                                     float& scale) {
  const float mean = sum_squares / a.count;
  v = a.beta2 * v + a.one_minus_beta2 * mean;
  scale = 1.0f / sqrtf(fmaxf(v, a.eps));
}

// ---- SOAP: Adam in the rotated basis (spec §3.6.3 S5) -----------------------------------------

struct SoapAdamArgs {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.95f;
  float one_minus_beta2 = 0.05f;
  float eps = 1e-8f;
  float bias_correction1 = 1.0f;  // 1 − β1^t, or 1 without bias correction
  float bias_correction2 = 1.0f;
  bool nesterov = false;
  float nesterov_momentum_coef = 0.0f;  // β1/(1 − β1^(t+1)), or β1 without bias correction
  float nesterov_grad_coef = 0.0f;      // (1 − β1)/bc1, or 1 − β1
};

// `t` is the 1-based step (s + 1).
inline SoapAdamArgs MakeSoapAdamArgs(double beta1, double beta2, double eps, bool correct_bias,
                                     bool nesterov, long long t) {
  SoapAdamArgs a;
  a.beta1 = static_cast<float>(beta1);
  a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  a.beta2 = static_cast<float>(beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.eps = static_cast<float>(eps);
  a.nesterov = nesterov;
  const double tt = static_cast<double>(t);
  const double bc1 = correct_bias ? 1.0 - std::pow(beta1, tt) : 1.0;
  if (correct_bias) {
    a.bias_correction1 = static_cast<float>(bc1);
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, tt));
  }
  a.nesterov_momentum_coef =
      static_cast<float>(correct_bias ? beta1 / (1.0 - std::pow(beta1, tt + 1.0)) : beta1);
  a.nesterov_grad_coef = static_cast<float>((1.0 - beta1) / bc1);
  return a;
}

// M ← β1·M + (1−β1)·g; V ← β2·V + (1−β2)·g²; d ← N/(√(V/bc2) + ε).
OPTSTEP_HD void SoapAdamElement(const SoapAdamArgs& a, float g, float& m, float& v, float& d) {
  m = a.beta1 * m + a.one_minus_beta1 * g;
  v = a.beta2 * v + a.one_minus_beta2 * g * g;
  const float n =
      a.nesterov ? a.nesterov_momentum_coef * m + a.nesterov_grad_coef * g : m / a.bias_correction1;
  d = n / (sqrtf(v / a.bias_correction2) + a.eps);
}

// ---- generic ----------------------------------------------------------------------------------

// y ← α·x + β·y; with β == 0, y is not read (BLAS convention: a NaN in y does not propagate).
OPTSTEP_HD void AxpbyElement(float alpha, float x, float beta, float& y) {
  y = beta == 0.0f ? alpha * x : alpha * x + beta * y;
}

}  // namespace math
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATH_EMERGING_H_
