#ifndef OPTSTEP_KERNELS_DEVICE_VALIDATION_H_
#define OPTSTEP_KERNELS_DEVICE_VALIDATION_H_

// Host-side argument checks shared by every Device implementation, so that all devices answer
// the same bad request with the same code and message (the conformance suite asserts both).
// Every function returns OK or INVALID_ARGUMENT; `op` names the Device method ("AdamW") and
// starts the message. Stateless and thread-safe.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"

namespace optstep {
namespace internal {

// Whether `dtype` is one of the enumerators (a value cast from wire data may not be).
bool IsKnownDType(DType dtype);

// Bytes of a tensor of `dtype` and `shape`: INVALID_ARGUMENT for an unknown dtype, a negative
// dimension, or an element or byte count that does not fit in int64.
absl::StatusOr<int64_t> AllocationBytes(absl::string_view op, DType dtype, const Shape& shape);

// value is finite and inside [lo or (lo, hi] or hi); hi = +inf means "no upper bound".
//   "AdamW: beta1 must be in [0, 1), got 1"
absl::Status CheckArgRange(absl::string_view op, absl::string_view name, float value, float lo,
                           bool lo_inclusive, float hi, bool hi_inclusive);
// value is finite and >= 0.
absl::Status CheckArgNonNegative(absl::string_view op, absl::string_view name, float value);

// `tensor` is allocated and fp32. `name` is the argument's name in messages.
absl::Status CheckF32(absl::string_view op, absl::string_view name, const Tensor& tensor);

// `a` and `b` hold the same number of elements.
absl::Status CheckSameSize(absl::string_view op, absl::string_view name_a, const Tensor& a,
                           absl::string_view name_b, const Tensor& b);

// Device::ScaleByInverseNorm: every tensor fp32, x and out of one size, eps finite and > 0.
absl::Status CheckScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                     const Tensor& out);

// Copy: both tensors allocated, same dtype, same number of elements.
absl::Status CheckCopy(const Tensor& src, const Tensor& dst);

// `a` and `b` are different tensors (updates may not alias their inputs or each other).
absl::Status CheckDistinct(absl::string_view op, absl::string_view name_a, const Tensor& a,
                           absl::string_view name_b, const Tensor& b);

// A host transfer of `count` elements at `offset` of the fp32 `tensor`, with host address
// `host` of `host_dtype`: count, offset >= 0, [offset, offset + count) inside the tensor,
// host != nullptr unless count == 0.
//   "CopyFromHost: range [4096, 8192) exceeds tensor of 4096 elements"
absl::Status CheckHostTransfer(absl::string_view op, const Tensor& tensor, int64_t offset,
                               int64_t count, DType host_dtype, const void* host);

// Hyperparameters: finite, lr >= 0, eps >= 0, 0 <= beta < 1, 0 < one_minus_beta <= 1,
// weight_decay >= 0, 0 < bias_correction <= 1.
absl::Status CheckAdamWArgs(const math::AdamWArgs& args);
// lr >= 0, momentum >= 0, weight_decay >= 0 (finite); nesterov needs momentum > 0.
absl::Status CheckSgdArgs(const math::SgdArgs& args);

// Everything UpdateKernels::AdamW requires: valid args, four distinct fp32 tensors of equal size.
absl::Status CheckAdamW(const math::AdamWArgs& args, const Tensor& grad, const Tensor& param,
                        const Tensor& exp_avg, const Tensor& exp_avg_sq);
// Everything UpdateKernels::Sgd requires: valid args, fp32 grad and param of equal size, and a
// distinct buffer of that size when momentum != 0 (ignored, but still checked, otherwise).
absl::Status CheckSgd(const math::SgdArgs& args, const Tensor& grad, const Tensor& param,
                      const Tensor* momentum_buffer);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_VALIDATION_H_
