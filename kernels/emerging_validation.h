#ifndef OPTSTEP_KERNELS_EMERGING_VALIDATION_H_
#define OPTSTEP_KERNELS_EMERGING_VALIDATION_H_

// Host-side checks of the element-wise updates of the emerging optimizers (UpdateKernels: Lion,
// MuonMomentum, Adamuon, NormuonMoment, SoapAdam; and Device::Axpby), shared by every Device
// implementation so that all answer a bad request with the same INVALID_ARGUMENT message.
// Stateless.

#include "absl/status/status.h"
#include "kernels/math/emerging.h"
#include "kernels/tensor.h"

namespace optstep {
namespace internal {

// lr >= 0; betas in [0, 1); 1 − beta in (0, 1]; a finite decay coefficient. Then three distinct
// fp32 tensors of equal size.
absl::Status CheckLion(const math::LionArgs& args, const Tensor& grad, const Tensor& param,
                       const Tensor& exp_avg);
// momentum in [0, 1), 1 − momentum in (0, 1], finite decay; four distinct fp32 tensors of equal
// size.
absl::Status CheckMuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad,
                               const Tensor& param, const Tensor& momentum, const Tensor& update);
// lr >= 0, beta2 in [0, 1), 1 − beta2 in (0, 1], eps >= 0, count >= 1.
absl::Status CheckMoment2Args(absl::string_view op, const math::Moment2Args& args);
absl::Status CheckAdamuon(const math::Moment2Args& args, const Tensor& update, const Tensor& param,
                          const Tensor& moment);
absl::Status CheckNormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                                const Tensor& moment, const Tensor& scale);
// betas in [0, 1), 1 − beta in (0, 1], eps >= 0, bias corrections in (0, 1], finite Nesterov
// coefficients; four distinct fp32 tensors of equal size.
absl::Status CheckSoapAdam(const math::SoapAdamArgs& args, const Tensor& grad,
                           const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const Tensor& direction);
// Finite alpha and beta; fp32 x and y of equal size (x may be y).
absl::Status CheckAxpby(float alpha, const Tensor& x, float beta, const Tensor& y);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_EMERGING_VALIDATION_H_
