// The defaults of Device that a device may override. See device.h.

#include "kernels/device.h"

#include <algorithm>
#include <cmath>

#include "base/status_macros.h"
#include "kernels/device_validation.h"

namespace optstep {

absl::Status Device::ScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                        Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckScaleByInverseNorm(norm_of, eps, x, out));
  OPTSTEP_ASSIGN_OR_RETURN(const GradientStats stats, ComputeGradientStats(norm_of));
  const double norm = std::sqrt(stats.sum_squares);
  const float factor = static_cast<float>(1.0 / std::max(norm, static_cast<double>(eps)));
  if (std::isnan(factor)) {  // Axpby takes finite factors only; the product is NaN all the same
    OPTSTEP_RETURN_IF_ERROR(Copy(x, out));
    return Scale(factor, out);
  }
  return Axpby(factor, x, 0.0f, out);
}

}  // namespace optstep
