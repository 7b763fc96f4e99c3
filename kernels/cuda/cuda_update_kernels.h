#ifndef OPTSTEP_KERNELS_CUDA_CUDA_UPDATE_KERNELS_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_UPDATE_KERNELS_H_

#include "absl/status/status.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/tensor.h"
#include "kernels/update_kernels.h"

namespace optstep {
namespace internal {
struct CudaContext;  // cuda_context.h
}  // namespace internal

// The optimizer updates of CudaDevice: the kernels of update_kernels.cu over the shared formulas of
// kernels/math, enqueued on the device's stream (AdamW and SGD in cuda_device.cc, the emerging
// optimizers in cuda_device_emerging.cc). Every method enqueues its work and returns.
//
// Thread safety: as Device; every method first makes the device current (cudaSetDevice).
class CudaUpdateKernels final : public UpdateKernels {
 public:
  // `ctx` outlives this object (both are owned by the CudaDevice).
  explicit CudaUpdateKernels(const internal::CudaContext* ctx) : ctx_(ctx) {}

  CudaUpdateKernels(const CudaUpdateKernels&) = delete;
  CudaUpdateKernels& operator=(const CudaUpdateKernels&) = delete;

  absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                     Tensor& exp_avg, Tensor& exp_avg_sq) override;
  absl::Status Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                   Tensor* momentum_buffer) override;
  absl::Status Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                    Tensor& exp_avg) override;
  absl::Status MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad, Tensor& param,
                            Tensor& momentum, Tensor& update) override;
  absl::Status Adamuon(const math::Moment2Args& args, const Tensor& update, Tensor& param,
                       Tensor& moment) override;
  absl::Status NormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                             Tensor& moment, Tensor& scale) override;
  absl::Status SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad, Tensor& exp_avg,
                        Tensor& exp_avg_sq, Tensor& direction) override;

 private:
  const internal::CudaContext* const ctx_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_UPDATE_KERNELS_H_
