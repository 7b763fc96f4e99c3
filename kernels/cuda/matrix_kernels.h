#ifndef OPTSTEP_KERNELS_CUDA_MATRIX_KERNELS_H_
#define OPTSTEP_KERNELS_CUDA_MATRIX_KERNELS_H_

// Plain launchers of the data-movement kernels of the CUDA device's matrix primitives
// (matrix_kernels.cu). Matrices are row-major unless a name says column-major; pointers are
// device pointers; nothing is validated here (CudaDevice validates on the host first). Each
// enqueues on launch.stream and returns the launch status. Thread-safe.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elementwise_kernels.h"

namespace optstep {
namespace gpu {

// dst{cols, rows} ← src{rows, cols}ᵀ.
cudaError_t LaunchTranspose(const float* src, float* dst, int64_t rows, int64_t cols,
                            const Launch& launch);
// out ← Σ a⊙b per row (per_row, out has `rows` entries) or per column; float64 sums in index
// order, one rounding to fp32.
cudaError_t LaunchAxisDot(const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                          bool per_row, const Launch& launch);
// x ← x ⊙ v broadcast per row (v has `rows` entries) or per column.
cudaError_t LaunchAxisScale(const float* v, float* x, int64_t rows, int64_t cols, bool per_row,
                            const Launch& launch);
// dst rows (axis 0) or columns (axis 1) ← src's, permuted by the device array `perm`.
cudaError_t LaunchPermute(const float* src, const int64_t* perm, float* dst, int64_t rows,
                          int64_t cols, int axis, const Launch& launch);
// *flag (device, zeroed by the caller) becomes nonzero when an off-diagonal entry of the {n, n}
// matrix is nonzero.
cudaError_t LaunchOffDiagonalFlag(const float* a, int64_t n, unsigned int* flag,
                                  const Launch& launch);
// a[i, i] += shift.
cudaError_t LaunchAddDiagonal(float* a, int64_t n, float shift, const Launch& launch);
// q{n, n} ← identity columns in the order `perm`: q[i, j] = (i == perm[j]).
cudaError_t LaunchPermutedIdentity(const int64_t* perm, float* q, int64_t n, const Launch& launch);
// dst[i, j] (row-major fp32) ← column n−1−j of the column-major {n, n} `src`: eigenvectors from a
// solver's ascending order to descending columns.
cudaError_t LaunchEigenvectorsDescending(const float* src, float* dst, int64_t n,
                                         const Launch& launch);
cudaError_t LaunchEigenvectorsDescending(const double* src, float* dst, int64_t n,
                                         const Launch& launch);
// Element-wise widening to float64.
cudaError_t LaunchF32ToF64(const float* src, double* dst, int64_t n, const Launch& launch);

}  // namespace gpu
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_MATRIX_KERNELS_H_
