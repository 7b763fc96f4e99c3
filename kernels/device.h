#ifndef OPTSTEP_KERNELS_DEVICE_H_
#define OPTSTEP_KERNELS_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"

namespace optstep {

// Result of one pass over a gradient: the sum of squares for the global norm and whether every
// element is finite.
struct GradientStats {
  double sum_squares = 0.0;
  bool all_finite = true;
};

// Runs memory management, dtype conversion and optimizer updates on one device.
// Implementations: CpuDevice (always built) and CudaDevice (--config=cuda).
//
// Thread safety: CopyFromHost and CopyToHost may be called concurrently from several threads when
// their device ranges do not overlap a tensor being updated; every other method is
// thread-compatible, and the engine's per-device worker serialises those calls.
//
// Every method validates its arguments on the host before touching memory and answers
// INVALID_ARGUMENT (mismatched sizes, ranges, dtypes) without side effects. Tensors passed to
// updates are fp32. Errors reported by the device library after validation are INTERNAL.
class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:<ordinal>".
  virtual std::string name() const = 0;

  // A zero-filled tensor. RESOURCE_EXHAUSTED when the memory cannot be had.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) = 0;
  // Bytes currently held by tensors of this device.
  virtual int64_t allocated_bytes() const = 0;

  virtual absl::Status Zero(Tensor& tensor) = 0;

  // Converts `count` elements of `src_dtype` at host address `src` to fp32 and writes them to
  // dst[dst_offset, dst_offset + count).
  // REQUIRES: dst is fp32 and the range lies inside it.
  virtual absl::Status CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                    int64_t dst_offset) = 0;
  // Converts src[offset, offset + count) (fp32) to `dst_dtype` at host address `dst`
  // (round to nearest even for bf16/fp16).
  virtual absl::Status CopyToHost(const Tensor& src, int64_t offset, int64_t count,
                                  DType dst_dtype, void* dst) = 0;

  // dst <- src. REQUIRES: same dtype and number of elements.
  virtual absl::Status Copy(const Tensor& src, Tensor& dst) = 0;
  // dst <- dst + src (fp32). REQUIRES: same number of elements.
  virtual absl::Status Add(const Tensor& src, Tensor& dst) = 0;
  // x <- scale · x (fp32).
  virtual absl::Status Scale(float scale, Tensor& x) = 0;

  // Σ x² accumulated in float64 over fixed-size blocks added in order, so the result does not
  // depend on the number of threads; and whether every element is finite.
  virtual absl::StatusOr<GradientStats> ComputeGradientStats(const Tensor& grad) = 0;

  // Adam / AdamW (spec §3.1) on every element.
  // REQUIRES: grad, param, exp_avg, exp_avg_sq have the same number of elements.
  virtual absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                             Tensor& exp_avg, Tensor& exp_avg_sq) = 0;
  // SGD (spec §3.2). `momentum_buffer` may be null when args.momentum == 0.
  virtual absl::Status Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                           Tensor* momentum_buffer) = 0;

  // Waits for all work queued on the device.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_H_
