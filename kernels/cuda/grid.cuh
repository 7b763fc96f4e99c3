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

}  // namespace internal
}  // namespace gpu
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_GRID_CUH_
