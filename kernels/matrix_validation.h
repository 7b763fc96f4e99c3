#ifndef OPTSTEP_KERNELS_MATRIX_VALIDATION_H_
#define OPTSTEP_KERNELS_MATRIX_VALIDATION_H_

// Host-side checks of the matrix primitives (MatrixKernels: Gemm, Transpose, CopyRowBlocks,
// AxisDot, AxisScale, Permute, SymmetricEigh, Qr; and Device::Convert), shared by every
// implementation so that all answer a bad request with the same INVALID_ARGUMENT message, e.g.
//   "Gemm: op(a) is [4, 3] but op(b) is [5, 2]". Stateless.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {
namespace internal {

absl::Status CheckGemm(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& c);
// Device::GemmFrom: CheckGemm, c square when `symmetric`, and d of c's shape and dtype.
absl::Status CheckGemmFrom(const GemmArgs& args, bool symmetric, const Tensor& a, const Tensor& b,
                           const Tensor& d, const Tensor& c);
absl::Status CheckConvert(const Tensor& src, const Tensor& dst);
absl::Status CheckTranspose(const Tensor& src, const Tensor& dst);
absl::Status CheckRowBlockCopy(const RowBlockCopy& copy, const Tensor& src, const Tensor& dst);
absl::Status CheckAxisDot(const Tensor& a, const Tensor& b, const Tensor& out);
absl::Status CheckAxisScale(const Tensor& v, const Tensor& x);
absl::Status CheckPermute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                          const Tensor& dst);
absl::Status CheckSymmetricEigh(const Tensor& a, float shift, const Tensor& eigenvalues,
                                const Tensor& eigenvectors);
absl::Status CheckQr(const Tensor& a, const Tensor& q);

// Whether the {m, 1} / {1, n} vector `v` runs along the rows of an {m, n} matrix (one value per
// row). REQUIRES: CheckAxisScale or CheckAxisDot accepted the shapes.
bool PerRow(const Tensor& v, const Tensor& matrix);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATRIX_VALIDATION_H_
