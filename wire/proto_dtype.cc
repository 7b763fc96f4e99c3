#include "wire/proto_dtype.h"

#include "absl/strings/str_cat.h"

namespace optstep {

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view what) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ", static_cast<int>(dtype),
                                                     " is not one of fp32, bf16, fp16"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace optstep
