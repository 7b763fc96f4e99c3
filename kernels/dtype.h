#ifndef OPTSTEP_KERNELS_DTYPE_H_
#define OPTSTEP_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace optstep {

// Element types that cross the wire. Masters and optimizer states are always kF32.
enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
};

// Bytes per element: 4 or 2.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// "fp32", "bf16", "fp16".
absl::string_view DTypeName(DType dtype);

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DTYPE_H_
