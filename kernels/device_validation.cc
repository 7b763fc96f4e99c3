#include "kernels/device_validation.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace internal {

absl::Status CheckArgRange(absl::string_view op, absl::string_view name, float value, float lo,
                        bool lo_inclusive, float hi, bool hi_inclusive) {
  bool ok = std::isfinite(value) && (lo_inclusive ? value >= lo : value > lo) &&
            (hi_inclusive ? value <= hi : value < hi);
  if (ok) return absl::OkStatus();
  if (hi == std::numeric_limits<float>::infinity()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be finite and ", lo_inclusive ? ">= " : "> ", lo, ", got ", value));
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be in ",
                                                 lo_inclusive ? "[" : "(", lo, ", ", hi,
                                                 hi_inclusive ? "]" : ")", ", got ", value));
}

absl::Status CheckArgNonNegative(absl::string_view op, absl::string_view name, float value) {
  return CheckArgRange(op, name, value, 0.0f, true, std::numeric_limits<float>::infinity(), false);
}

bool IsKnownDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

absl::StatusOr<int64_t> AllocationBytes(absl::string_view op, DType dtype, const Shape& shape) {
  if (!IsKnownDType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown dtype ", static_cast<int>(dtype)));
  }
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": shape ", ShapeString(shape), " has more than 2^63 elements"));
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(dtype)), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shape ", ShapeString(shape), " of ",
                                                   DTypeName(dtype), " exceeds 2^63 bytes"));
  }
  return bytes;
}

absl::Status CheckF32(absl::string_view op, absl::string_view name, const Tensor& tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " is not allocated"));
  }
  if (tensor.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " is ", DTypeName(tensor.dtype()), "; this operation needs fp32"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameSize(absl::string_view op, absl::string_view name_a, const Tensor& a,
                           absl::string_view name_b, const Tensor& b) {
  if (a.numel() == b.numel()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name_a, " has ", a.numel(),
                                                 " elements but ", name_b, " has ", b.numel()));
}

absl::Status CheckScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                     const Tensor& out) {
  constexpr absl::string_view kOp = "ScaleByInverseNorm";
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "norm_of", norm_of));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "x", x));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "out", out));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "out", out, "x", x));
  return CheckArgRange(kOp, "eps", eps, 0.0f, false, std::numeric_limits<float>::infinity(), false);
}

absl::Status CheckDistinct(absl::string_view op, absl::string_view name_a, const Tensor& a,
                           absl::string_view name_b, const Tensor& b) {
  if (&a != &b && a.data() != b.data()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name_a, " and ", name_b, " are the same tensor"));
}

absl::Status CheckHostTransfer(absl::string_view op, const Tensor& tensor, int64_t offset,
                               int64_t count, DType host_dtype, const void* host) {
  OPTSTEP_RETURN_IF_ERROR(CheckF32(op, "device tensor", tensor));
  if (!IsKnownDType(host_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": unknown host dtype ", static_cast<int>(host_dtype)));
  }
  if (offset < 0 || count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative offset ", offset, " or count ", count));
  }
  if (offset > tensor.numel() || count > tensor.numel() - offset) {
    // Both are non-negative int64, so their sum fits in uint64.
    uint64_t end = static_cast<uint64_t>(offset) + static_cast<uint64_t>(count);
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": range [", offset, ", ", end, ") exceeds tensor of ", tensor.numel(), " elements"));
  }
  if (host == nullptr && count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": null host pointer for ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckAdamWArgs(const math::AdamWArgs& a) {
  constexpr absl::string_view kOp = "AdamW";
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "lr", a.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckArgRange(kOp, "beta1", a.beta1, 0.0f, true, 1.0f, false));
  OPTSTEP_RETURN_IF_ERROR(CheckArgRange(kOp, "beta2", a.beta2, 0.0f, true, 1.0f, false));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "one_minus_beta1", a.one_minus_beta1, 0.0f, false, 1.0f, true));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "one_minus_beta2", a.one_minus_beta2, 0.0f, false, 1.0f, true));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "eps", a.eps));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "weight_decay", a.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "bias_correction1", a.bias_correction1, 0.0f, false, 1.0f, true));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "bias_correction2", a.bias_correction2, 0.0f, false, 1.0f, true));
  return CheckArgRange(kOp, "grad_scale", a.grad_scale, 0.0f, false, 1.0f, true);
}

absl::Status CheckSgdArgs(const math::SgdArgs& a) {
  constexpr absl::string_view kOp = "Sgd";
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "lr", a.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "momentum", a.momentum));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "weight_decay", a.weight_decay));
  if (a.nesterov && a.momentum == 0.0f) {
    return absl::InvalidArgumentError("Sgd: nesterov needs momentum > 0");
  }
  return CheckArgRange(kOp, "grad_scale", a.grad_scale, 0.0f, false, 1.0f, true);
}

absl::Status CheckAdamW(const math::AdamWArgs& args, const Tensor& grad, const Tensor& param,
                        const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  constexpr absl::string_view kOp = "AdamW";
  OPTSTEP_RETURN_IF_ERROR(CheckAdamWArgs(args));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "param", param));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "exp_avg", exp_avg));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "exp_avg_sq", exp_avg_sq));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "param", param, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "exp_avg", exp_avg, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "exp_avg_sq", exp_avg_sq, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "grad", grad, "param", param));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "grad", grad, "exp_avg", exp_avg));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "grad", grad, "exp_avg_sq", exp_avg_sq));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "param", param, "exp_avg", exp_avg));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "param", param, "exp_avg_sq", exp_avg_sq));
  return CheckDistinct(kOp, "exp_avg", exp_avg, "exp_avg_sq", exp_avg_sq);
}

absl::Status CheckSgd(const math::SgdArgs& args, const Tensor& grad, const Tensor& param,
                      const Tensor* momentum_buffer) {
  constexpr absl::string_view kOp = "Sgd";
  OPTSTEP_RETURN_IF_ERROR(CheckSgdArgs(args));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "param", param));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "param", param, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "grad", grad, "param", param));
  if (momentum_buffer == nullptr) {
    if (args.momentum != 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sgd: momentum ", args.momentum, " needs a momentum_buffer"));
    }
    return absl::OkStatus();
  }
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "momentum_buffer", *momentum_buffer));
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize(kOp, "momentum_buffer", *momentum_buffer, "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "grad", grad, "momentum_buffer", *momentum_buffer));
  return CheckDistinct(kOp, "param", param, "momentum_buffer", *momentum_buffer);
}

absl::Status CheckCopy(const Tensor& src, const Tensor& dst) {
  if (!src.defined() || !dst.defined()) {
    return absl::InvalidArgumentError("Copy: tensor is not allocated");
  }
  if (src.dtype() != dst.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("Copy: src is ", DTypeName(src.dtype()),
                                                   " but dst is ", DTypeName(dst.dtype())));
  }
  return CheckSameSize("Copy", "dst", dst, "src", src);
}

}  // namespace internal
}  // namespace optstep
