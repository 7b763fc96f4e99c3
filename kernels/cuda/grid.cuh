#ifndef OPTSTEP_KERNELS_CUDA_GRID_CUH_
#define OPTSTEP_KERNELS_CUDA_GRID_CUH_

// Grid-stride helpers shared by the .cu files of kernels/cuda (nvcc only).

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise_kernels.h"

namespace optstep {
namespace gpu {
namespace internal {

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Blocks of kThreadsPerBlock threads for `items` work items, at most launch.max_blocks.
inline int Blocks(int64_t items, const Launch& launch) {
  const int64_t wanted = (items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, launch.max_blocks)));
}

// 16-byte aligned: float4 loads and stores may be used.
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Lane j of q (j a compile-time constant after unrolling: a register, not a memory access).
__device__ __forceinline__ float& Lane(float4& q, int j) {
  return j == 0 ? q.x : (j == 1 ? q.y : (j == 2 ? q.z : q.w));
}

// The loop of an element-wise kernel over n elements of the kIn + kInOut + kOut arrays `ptrs`:
// for each i, element(v) with v[k] = ptrs[k][i] for the kIn inputs and kInOut in-outs (the kOut
// outputs after them are not read), then ptrs[k][i] = v[k] for the in-outs and outputs. With
// kVector (every pointer 16-byte aligned) four elements move through float4 loads and stores at
// a time and the tail one by one; each element is computed by `element` either way, so the bits
// do not depend on the alignment.
template <int kIn, int kInOut, int kOut, bool kVector, typename Element>
__device__ __forceinline__ void ForEachElement(int64_t n, float* const (&ptrs)[kIn + kInOut + kOut],
                                               Element element) {
  constexpr int kTotal = kIn + kInOut + kOut;
  constexpr int kRead = kIn + kInOut;
  int64_t scalar_begin = 0;
  if (kVector) {
    const int64_t n4 = n / 4;
    for (int64_t i = FirstIndex(); i < n4; i += Stride()) {
      float4 q[kTotal];
#pragma unroll
      for (int k = 0; k < kRead; ++k) q[k] = reinterpret_cast<const float4*>(ptrs[k])[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v[kTotal];
#pragma unroll
        for (int k = 0; k < kRead; ++k) v[k] = Lane(q[k], j);
        element(v);
#pragma unroll
        for (int k = kIn; k < kTotal; ++k) Lane(q[k], j) = v[k];
      }
#pragma unroll
      for (int k = kIn; k < kTotal; ++k) reinterpret_cast<float4*>(ptrs[k])[i] = q[k];
    }
    scalar_begin = 4 * n4;
  }
  for (int64_t i = scalar_begin + FirstIndex(); i < n; i += Stride()) {
    float v[kTotal];
#pragma unroll
    for (int k = 0; k < kRead; ++k) v[k] = ptrs[k][i];
    element(v);
#pragma unroll
    for (int k = kIn; k < kTotal; ++k) ptrs[k][i] = v[k];
  }
}

// Launches `vector_kernel` (float4s) when `aligned` (every pointer 16-byte aligned), else
// `scalar_kernel`, with enough blocks for the work items of either; nothing when n == 0.
template <typename Kernel, typename... Args>
cudaError_t LaunchElementwise(Kernel vector_kernel, Kernel scalar_kernel, bool aligned, int64_t n,
                              const Launch& launch, Args... args) {
  if (n == 0) return cudaSuccess;
  const int blocks = Blocks(aligned ? (n + 3) / 4 : n, launch);
  const Kernel kernel = aligned ? vector_kernel : scalar_kernel;
  kernel<<<blocks, kThreadsPerBlock, 0, launch.stream>>>(args..., n);
  return cudaGetLastError();
}

}  // namespace internal
}  // namespace gpu
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_GRID_CUH_
