#ifndef OPTSTEP_KERNELS_CPU_CPU_UPDATE_KERNELS_H_
#define OPTSTEP_KERNELS_CPU_CPU_UPDATE_KERNELS_H_

#include "absl/status/status.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/tensor.h"
#include "kernels/update_kernels.h"

namespace optstep {

// The optimizer updates of CpuDevice: OpenMP loops over the per-element formulas of kernels/math
// (AdamW and SGD in cpu_device.cc, the emerging optimizers in cpu_device_emerging.cc), split as
// the device's loops are (CpuContext). Every method runs to completion before it returns.
//
// Thread safety: thread-compatible, as Device. Owned by its CpuDevice.
class CpuUpdateKernels final : public UpdateKernels {
 public:
  explicit CpuUpdateKernels(internal::CpuContext ctx) : ctx_(ctx) {}

  CpuUpdateKernels(const CpuUpdateKernels&) = delete;
  CpuUpdateKernels& operator=(const CpuUpdateKernels&) = delete;

  absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                     Tensor& exp_avg, Tensor& exp_avg_sq) override;
  // One OpenMP region over every element of the batch (internal::ParallelSpans).
  absl::Status AdamWBatch(const math::AdamWArgs& args,
                          absl::Span<const AdamWOperands> batch) override;
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
  const internal::CpuContext ctx_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_UPDATE_KERNELS_H_
