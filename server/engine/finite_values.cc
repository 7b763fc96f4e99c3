#include "server/engine/finite_values.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/math/half.h"

namespace optstep {
namespace {

float ElementAt(DType dtype, const char* bytes, int64_t i) {
  if (dtype == DType::kF32) {
    float value;
    std::memcpy(&value, bytes + i * 4, 4);
    return value;
  }
  uint16_t half;
  std::memcpy(&half, bytes + i * 2, 2);
  return dtype == DType::kBF16 ? math::Bf16ToFloat(half) : math::Fp16ToFloat(half);
}

}  // namespace

absl::Status CheckFiniteValues(absl::string_view owner, absl::string_view what, int64_t offset,
                               DType dtype, const void* data, int64_t count) {
  const char* bytes = static_cast<const char*>(data);
  for (int64_t i = 0; i < count; ++i) {
    const float value = ElementAt(dtype, bytes, i);
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(owner, ": ", what, " at element ", offset + i, " is ", value));
    }
  }
  return absl::OkStatus();
}

}  // namespace optstep
