#include "client/cpp/proto_dtype.h"

#include "absl/strings/str_cat.h"

namespace optstep {
namespace client_internal {

v1::DType ToWireDType(DType dtype) {
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

absl::StatusOr<DType> FromWireDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP16:
      return DType::kF16;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", v1::DType_Name(dtype), " (", static_cast<int>(dtype),
                   ") is not fp32, bf16 or fp16"));
}

}  // namespace client_internal
}  // namespace optstep
