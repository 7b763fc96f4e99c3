#ifndef OPTSTEP_KERNELS_MATRIX_TYPES_H_
#define OPTSTEP_KERNELS_MATRIX_TYPES_H_

// Argument types of the matrix primitives of Device (kernels/device.h). Plain values; no state.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

// How a matrix product is computed (docs/spec/optimizers.md §1.2).
//   kHighest  true fp32 products.
//   kHigh     fp32 in/out with TF32 tensor-core products on GPUs; fp32 on the CPU.
//   kMedium   bf16-class products: for fp32 tensors the inputs are rounded to bf16 and the
//             products accumulate in fp32 (fp32 output); bf16 tensors are always multiplied this
//             way and their result is rounded to bf16.
enum class MatmulPrecision : int { kHighest = 0, kHigh = 1, kMedium = 2 };

// "highest", "high", "medium".
absl::string_view MatmulPrecisionName(MatmulPrecision precision);
// Exactly "highest", "high" or "medium"; anything else is INVALID_ARGUMENT naming `owner`.
absl::StatusOr<MatmulPrecision> ParseMatmulPrecision(absl::string_view owner,
                                                     absl::string_view name);

// C ← α·op(A)·op(B) + β·C on row-major matrices, op(X) = Xᵀ when the flag is set. With β == 0, C
// is not read (a NaN in it does not propagate).
struct GemmArgs {
  MatmulPrecision precision = MatmulPrecision::kHighest;
  bool transpose_a = false;
  bool transpose_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// A strided copy of row blocks between two matrices of the same width: for b in [0, num_blocks),
// rows [src_first_row + b·src_block_stride, + block_rows) of the source go to rows
// [dst_first_row + b·dst_block_stride, + block_rows) of the destination. Gathers and scatters
// the interleaved Q/K/V rows of a fused projection (spec §3.4.6).
struct RowBlockCopy {
  int64_t num_blocks = 0;
  int64_t block_rows = 0;
  int64_t src_first_row = 0;
  int64_t src_block_stride = 0;
  int64_t dst_first_row = 0;
  int64_t dst_block_stride = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATRIX_TYPES_H_
