#ifndef OPTSTEP_KERNELS_UPDATE_KERNELS_H_
#define OPTSTEP_KERNELS_UPDATE_KERNELS_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/tensor.h"

namespace optstep {

// The tensors of one parameter in UpdateKernels::AdamWBatch (as the arguments of AdamW).
struct AdamWOperands {
  const Tensor* grad = nullptr;
  Tensor* param = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
};

// The element-wise optimizer updates of one device (formulas: kernels/math/elementwise.h and
// kernels/math/emerging.h), reached through Device::updates(); they run on the device's memory,
// stream and threads.
//
// Thread safety, validation and errors: as Device (kernels/device.h); tensors are fp32.
class UpdateKernels {
 public:
  virtual ~UpdateKernels() = default;

  // Adam / AdamW (spec §3.1) on every element.
  // REQUIRES: grad, param, exp_avg, exp_avg_sq have the same number of elements.
  virtual absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                             Tensor& exp_avg, Tensor& exp_avg_sq) = 0;
  // AdamW with the same `args` on every parameter of `batch`, with the bits of AdamW on each in
  // turn. A device may run the batch as one parallel loop (CpuDevice: one OpenMP region over all
  // the elements, where AdamW forks and joins once per tensor); this default steps them in turn.
  // Validates every operand before it updates any (INVALID_ARGUMENT naming the parameter's index)
  // when it runs them together.
  // REQUIRES: every operand as AdamW requires; no tensor appears in two operands.
  virtual absl::Status AdamWBatch(const math::AdamWArgs& args,
                                  absl::Span<const AdamWOperands> batch) {
    for (const AdamWOperands& t : batch) {
      absl::Status status = AdamW(args, *t.grad, *t.param, *t.exp_avg, *t.exp_avg_sq);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }
  // SGD (spec §3.2). `momentum_buffer` may be null when args.momentum == 0.
  virtual absl::Status Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                           Tensor* momentum_buffer) = 0;

  // Lion (spec §3.3). REQUIRES: grad, param, exp_avg fp32 of equal size, distinct.
  virtual absl::Status Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                            Tensor& exp_avg) = 0;
  // Muon weight decay and EMA momentum (spec §3.4.2): updates param and momentum, writes the
  // matrix to orthogonalize into `update`. REQUIRES: four fp32 tensors of equal size, distinct.
  virtual absl::Status MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad,
                                    Tensor& param, Tensor& momentum, Tensor& update) = 0;
  // AdaptiveMuon "adamuon" (spec §3.5): v ← β2·v + (1−β2)·O², p ← p − η·O/(√v + ε).
  virtual absl::Status Adamuon(const math::Moment2Args& args, const Tensor& update, Tensor& param,
                               Tensor& moment) = 0;
  // AdaptiveMuon "normuon" moment (spec §3.5), per entry of the (m,1) or (1,n) moment:
  // v ← β2·v + (1−β2)·sum_squares/count; scale ← 1/√max(v, ε).
  // REQUIRES: three fp32 tensors of equal size; `scale` distinct from the others.
  virtual absl::Status NormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                                     Tensor& moment, Tensor& scale) = 0;
  // SOAP's Adam in the rotated basis (spec §3.6.3 S5): updates exp_avg, exp_avg_sq and writes the
  // normalized direction into `direction`. REQUIRES: four fp32 tensors of equal size, distinct.
  virtual absl::Status SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad, Tensor& exp_avg,
                                Tensor& exp_avg_sq, Tensor& direction) = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_UPDATE_KERNELS_H_
