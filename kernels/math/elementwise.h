#ifndef OPTSTEP_KERNELS_MATH_ELEMENTWISE_H_
#define OPTSTEP_KERNELS_MATH_ELEMENTWISE_H_

// Per-element optimizer update formulas (docs/spec/optimizers.md §3). The single source of truth
// for the CPU loops (kernels/cpu) and the CUDA kernels (kernels/cuda). Every value is fp32; scalar
// arguments are prepared once per step on the host (bias corrections, effective decay).

#include <cmath>

#include "kernels/math/host_device.h"

namespace optstep {
namespace math {

// Adam / AdamW for one parameter (spec §3.1). `weight_decay` is the effective λ = wd · wd_mult.
// Use MakeAdamWArgs to fill the derived fields consistently.
struct AdamWArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // 1 - beta, formed in double on the host and rounded once (as PyTorch passes its scalars);
  // forming it in fp32 would add up to 5e-5 relative error for beta2 = 0.999.
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = true;  // AdamW: decay fused into the update; false: L2 into the gradient.
  float bias_correction1 = 1.0f;  // 1 - beta1^t (1 when bias correction is off)
  float bias_correction2 = 1.0f;  // 1 - beta2^t
  // The gradient is used as g · grad_scale, the product in fp32 as ScaleElement forms it: the
  // global clip coefficient folded into the update (1: none), in (0, 1].
  float grad_scale = 1.0f;
};

// Host-side constructor: derives 1 - beta and the bias corrections 1 - beta^t in double.
// `step` is Adam's 1-based t; bias correction is off when `bias_correction` is false.
inline AdamWArgs MakeAdamWArgs(double lr, double beta1, double beta2, double eps,
                               double weight_decay, bool decoupled, bool bias_correction,
                               long long step) {
  AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  a.eps = static_cast<float>(eps);
  a.weight_decay = static_cast<float>(weight_decay);
  a.decoupled = decoupled;
  if (bias_correction) {
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  }
  return a;
}

OPTSTEP_HD void AdamWElement(const AdamWArgs& a, float g, float& p, float& m, float& v) {
  g = g * a.grad_scale;
  if (!a.decoupled) g = g + a.weight_decay * p;
  m = a.beta1 * m + a.one_minus_beta1 * g;
  v = a.beta2 * v + a.one_minus_beta2 * g * g;
  float d = (m / a.bias_correction1) / (sqrtf(v / a.bias_correction2) + a.eps);
  if (a.decoupled) d = d + a.weight_decay * p;  // pre-update p
  p = p - a.lr * d;
}

// SGD with momentum (spec §3.2): coupled L2 decay, torch-style momentum, optional Nesterov.
struct SgdArgs {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // effective λ
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer is absent: b <- d
  // The gradient is used as g · grad_scale, as in AdamWArgs: the clip coefficient, in (0, 1].
  float grad_scale = 1.0f;
};

// With momentum == 0 the buffer is unused and may alias anything.
OPTSTEP_HD void SgdElement(const SgdArgs& a, float g, float& p, float& b) {
  g = g * a.grad_scale;
  float d = g + a.weight_decay * p;
  float u = d;
  if (a.momentum != 0.0f) {
    b = a.first_step ? d : a.momentum * b + d;
    u = a.nesterov ? d + a.momentum * b : b;
  }
  p = p - a.lr * u;
}

// g <- g * scale (global clipping, replicated averaging).
OPTSTEP_HD void ScaleElement(float scale, float& x) { x = x * scale; }

}  // namespace math
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATH_ELEMENTWISE_H_
