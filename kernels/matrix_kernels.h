#ifndef OPTSTEP_KERNELS_MATRIX_KERNELS_H_
#define OPTSTEP_KERNELS_MATRIX_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {

// The matrix primitives of one device: GEMM, data movement and the factorizations of the
// emerging optimizers, reached through Device::matrix(); they run on the device's memory, stream
// and threads.
//
// Matrices are row-major 2-D tensors (shape {rows, cols}). Unless a method says otherwise, its
// output may not alias an input (INVALID_ARGUMENT when the data pointers are equal).
//
// Thread safety, validation and errors: as Device (kernels/device.h).
class MatrixKernels {
 public:
  virtual ~MatrixKernels() = default;

  // C ← α·op(A)·op(B) + β·C (kernels/matrix_types.h). A, B, C are 2-D with matching shapes and
  // all fp32, or all bf16 (then args.precision must be kMedium). C may not alias A or B.
  virtual absl::Status Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) = 0;
  // Gemm of a product that is symmetric in exact arithmetic (X·Xᵀ, A·A of a symmetric A,
  // (G·S)·Gᵀ of a symmetric S): C {m, m} ← α·op(A)·op(B) + β·C, arguments and errors as Gemm, and
  // INVALID_ARGUMENT when C is not square. REQUIRES: op(A)·op(B) symmetric in exact arithmetic; C
  // symmetric when β ≠ 0; A symmetric when B is A and neither is transposed (A·A: a device may
  // read A's rows for its columns). A device may compute only the entries on and above the diagonal
  // and mirror them below (the CPU does, so its result is exactly symmetric); this default runs the
  // full Gemm.
  virtual absl::Status SymmetricGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                     Tensor& c) {
    if (c.ndim() == 2 && c.dim(0) != c.dim(1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SymmetricGemm: c must be square, got shape ", ShapeString(c.shape())));
    }
    return Gemm(args, a, b, c);
  }
  // dst ← srcᵀ. REQUIRES: src fp32 {m, n}, dst fp32 {n, m}.
  virtual absl::Status Transpose(const Tensor& src, Tensor& dst) = 0;
  // Strided row-block copy between fp32 matrices of the same width; every range inside.
  virtual absl::Status CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src, Tensor& dst) = 0;
  // out ← Σ a⊙b along one axis, keeping it (numpy keepdims): `out` of shape {m, 1} sums each row,
  // {1, n} each column. Accumulated in float64 in index order, rounded to fp32 once.
  // REQUIRES: a, b fp32 of the same 2-D shape (b may be a); out fp32, distinct.
  virtual absl::Status AxisDot(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // x ← x ⊙ v, broadcast: `v` of shape {m, 1} scales rows, {1, n} columns of the fp32 {m, n} x.
  virtual absl::Status AxisScale(const Tensor& v, Tensor& x) = 0;
  // dst ← src with its rows (axis 0: dst[i, :] = src[perm[i], :]) or columns (axis 1:
  // dst[:, j] = src[:, perm[j]]) permuted. REQUIRES: fp32 matrices of the same shape; `perm` a
  // permutation of [0, size of the axis).
  virtual absl::Status Permute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                               Tensor& dst) = 0;
  // Eigen-decomposition of the symmetric fp32 {n, n} matrix `a` for SOAP (spec §3.6.3 "eigh
  // details"): the solver factors a + shift·I (only the upper triangle is read); columns of
  // `eigenvectors` {n, n} are unit eigenvectors ordered by descending eigenvalue, `eigenvalues`
  // {n} the eigenvalues of `a` (the shift subtracted). When `a` is exactly diagonal (every
  // off-diagonal entry zero) no solver runs: the eigenvectors are identity columns in the stable
  // descending order of the diagonal. When the fp32 solver fails it is retried in fp64.
  virtual absl::Status SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                                     Tensor& eigenvectors) = 0;
  // q ← the orthonormal factor of a Householder QR of the fp32 {m, n} matrix a, m ≥ n (thin Q,
  // {m, n}). Column signs are the solver's.
  virtual absl::Status Qr(const Tensor& a, Tensor& q) = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_MATRIX_KERNELS_H_
