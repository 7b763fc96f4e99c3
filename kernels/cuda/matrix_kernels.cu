// Data-movement kernels of the CUDA device's matrix primitives (see matrix_kernels.h).

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/matrix_kernels.h"

namespace optstep {
namespace gpu {
namespace {

using internal::Blocks;
using internal::FirstIndex;
using internal::Stride;

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// Tiled transpose through shared memory (padded against bank conflicts).
__global__ void TransposeKernel(const float* __restrict__ src, float* __restrict__ dst,
                                int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i;
    const int64_t c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i;           // row of dst
    const int64_t r = r0 + threadIdx.x;  // column of dst
    if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}

// One block per row (grid-stride over rows); a fixed shared-memory tree over the threads.
__global__ void __launch_bounds__(kThreadsPerBlock)
    RowDotKernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                 int64_t rows, int64_t cols) {
  __shared__ double shared[kThreadsPerBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double acc = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += kThreadsPerBlock) {
      acc += static_cast<double>(a[r * cols + c]) * static_cast<double>(b[r * cols + c]);
    }
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int half = kThreadsPerBlock / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = static_cast<float>(shared[0]);
    __syncthreads();
  }
}

// One thread per column, rows in order (coalesced across the threads of a warp).
__global__ void ColumnDotKernel(const float* __restrict__ a, const float* __restrict__ b,
                                float* __restrict__ out, int64_t rows, int64_t cols) {
  for (int64_t c = FirstIndex(); c < cols; c += Stride()) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      acc += static_cast<double>(a[r * cols + c]) * static_cast<double>(b[r * cols + c]);
    }
    out[c] = static_cast<float>(acc);
  }
}

__global__ void AxisScaleKernel(const float* __restrict__ v, float* __restrict__ x, int64_t rows,
                                int64_t cols, bool per_row) {
  const int64_t n = rows * cols;
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    x[i] = x[i] * v[per_row ? i / cols : i % cols];
  }
}

__global__ void PermuteKernel(const float* __restrict__ src, const int64_t* __restrict__ perm,
                              float* __restrict__ dst, int64_t rows, int64_t cols, int axis) {
  const int64_t n = rows * cols;
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    dst[i] = axis == 0 ? src[perm[r] * cols + c] : src[r * cols + perm[c]];
  }
}

__global__ void OffDiagonalFlagKernel(const float* __restrict__ a, int64_t n,
                                      unsigned int* flag) {
  const int64_t total = n * n;
  for (int64_t i = FirstIndex(); i < total; i += Stride()) {
    if (i / n != i % n && a[i] != 0.0f) atomicOr(flag, 1u);
  }
}

__global__ void AddDiagonalKernel(float* a, int64_t n, float shift) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) a[i * n + i] += shift;
}

__global__ void PermutedIdentityKernel(const int64_t* __restrict__ perm, float* __restrict__ q,
                                       int64_t n) {
  const int64_t total = n * n;
  for (int64_t i = FirstIndex(); i < total; i += Stride()) {
    q[i] = (i / n == perm[i % n]) ? 1.0f : 0.0f;
  }
}

template <typename T>
__global__ void EigenvectorsDescendingKernel(const T* __restrict__ src, float* __restrict__ dst,
                                             int64_t n) {
  const int64_t total = n * n;
  for (int64_t i = FirstIndex(); i < total; i += Stride()) {
    const int64_t row = i / n;
    const int64_t col = i % n;
    dst[i] = static_cast<float>(src[(n - 1 - col) * n + row]);
  }
}

__global__ void F32ToF64Kernel(const float* __restrict__ src, double* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = src[i];
}

}  // namespace

cudaError_t LaunchTranspose(const float* src, float* dst, int64_t rows, int64_t cols,
                            const Launch& launch) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  TransposeKernel<<<grid, dim3(kTile, kTileRows), 0, launch.stream>>>(src, dst, rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchAxisDot(const float* a, const float* b, float* out, int64_t rows, int64_t cols,
                          bool per_row, const Launch& launch) {
  if (rows == 0 || cols == 0) {
    const int64_t n = per_row ? rows : cols;
    return n == 0 ? cudaSuccess : cudaMemsetAsync(out, 0, n * sizeof(float), launch.stream);
  }
  if (per_row) {
    const int grid = static_cast<int>(std::min<int64_t>(rows, launch.max_blocks));
    RowDotKernel<<<grid, kThreadsPerBlock, 0, launch.stream>>>(a, b, out, rows, cols);
  } else {
    ColumnDotKernel<<<Blocks(cols, launch), kThreadsPerBlock, 0, launch.stream>>>(a, b, out, rows,
                                                                                 cols);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAxisScale(const float* v, float* x, int64_t rows, int64_t cols, bool per_row,
                            const Launch& launch) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  AxisScaleKernel<<<Blocks(rows * cols, launch), kThreadsPerBlock, 0, launch.stream>>>(
      v, x, rows, cols, per_row);
  return cudaGetLastError();
}

cudaError_t LaunchPermute(const float* src, const int64_t* perm, float* dst, int64_t rows,
                          int64_t cols, int axis, const Launch& launch) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  PermuteKernel<<<Blocks(rows * cols, launch), kThreadsPerBlock, 0, launch.stream>>>(
      src, perm, dst, rows, cols, axis);
  return cudaGetLastError();
}

cudaError_t LaunchOffDiagonalFlag(const float* a, int64_t n, unsigned int* flag,
                                  const Launch& launch) {
  if (n == 0) return cudaSuccess;
  OffDiagonalFlagKernel<<<Blocks(n * n, launch), kThreadsPerBlock, 0, launch.stream>>>(a, n,
                                                                                      flag);
  return cudaGetLastError();
}

cudaError_t LaunchAddDiagonal(float* a, int64_t n, float shift, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  AddDiagonalKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(a, n, shift);
  return cudaGetLastError();
}

cudaError_t LaunchPermutedIdentity(const int64_t* perm, float* q, int64_t n,
                                   const Launch& launch) {
  if (n == 0) return cudaSuccess;
  PermutedIdentityKernel<<<Blocks(n * n, launch), kThreadsPerBlock, 0, launch.stream>>>(perm, q,
                                                                                       n);
  return cudaGetLastError();
}

cudaError_t LaunchEigenvectorsDescending(const float* src, float* dst, int64_t n,
                                         const Launch& launch) {
  if (n == 0) return cudaSuccess;
  EigenvectorsDescendingKernel<float>
      <<<Blocks(n * n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchEigenvectorsDescending(const double* src, float* dst, int64_t n,
                                         const Launch& launch) {
  if (n == 0) return cudaSuccess;
  EigenvectorsDescendingKernel<double>
      <<<Blocks(n * n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToF64(const float* src, double* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  F32ToF64Kernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace optstep
