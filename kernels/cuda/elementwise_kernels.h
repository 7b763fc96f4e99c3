#ifndef OPTSTEP_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
#define OPTSTEP_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_

// Plain launcher functions for the element-wise CUDA kernels (elementwise_kernels.cu). Host code
// (cuda_device.cc, compiled by the host compiler) sees only these declarations.
//
// Every launcher enqueues its kernels on launch.stream and returns the launch status
// (cudaGetLastError); execution errors surface at the next synchronisation. Pointers are device
// pointers. The launchers do not validate: CudaDevice validates every argument on the host
// first. Stateless and thread-safe.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/math/elementwise.h"

namespace optstep {
namespace gpu {

// Threads per block of every kernel; the reductions rely on it.
constexpr int kThreadsPerBlock = 256;
// LaunchSumSquares reduces blocks of this many elements, one CUDA block each: 32 per thread,
// so that a 1M-element matrix already spreads over 128 blocks (the whole GPU, not 16 SMs).
constexpr int64_t kStatsBlockElements = int64_t{1} << 13;

struct Launch {
  cudaStream_t stream = nullptr;
  // Grid-stride loops use at most this many blocks (about one resident wave).
  int max_blocks = 1024;
};

// Conversions; `dst` may have any 4-byte (fp32) or 2-byte (half) alignment.
cudaError_t LaunchBf16ToF32(const uint16_t* src, float* dst, int64_t n, const Launch& launch);
cudaError_t LaunchF16ToF32(const uint16_t* src, float* dst, int64_t n, const Launch& launch);
cudaError_t LaunchF32ToBf16(const float* src, uint16_t* dst, int64_t n, const Launch& launch);
cudaError_t LaunchF32ToF16(const float* src, uint16_t* dst, int64_t n, const Launch& launch);

// dst[i] += src[i] (src may equal dst).
cudaError_t LaunchAdd(const float* src, float* dst, int64_t n, const Launch& launch);
// x[i] *= scale.
cudaError_t LaunchScale(float scale, float* x, int64_t n, const Launch& launch);

// math::AdamWElement on every element. REQUIRES: four distinct arrays.
cudaError_t LaunchAdamW(const math::AdamWArgs& args, const float* grad, float* param,
                        float* exp_avg, float* exp_avg_sq, int64_t n, const Launch& launch);
// math::SgdElement on every element; `buffer` may be null when args.momentum == 0.
cudaError_t LaunchSgd(const math::SgdArgs& args, const float* grad, float* param, float* buffer,
                      int64_t n, const Launch& launch);

// Float64 slots that LaunchSumSquares needs in `scratch` for n elements (at least 1).
int64_t SumSquaresScratchSize(int64_t n);
// *result (device) <- Σ x[i]² in float64, in an order fixed by n alone: block b of
// kStatsBlockElements elements is summed by thread t taking elements t, t + 256, ... in order,
// then a fixed shared-memory tree; block sums are reduced the same way. Deterministic run to
// run and for any grid size.
cudaError_t LaunchSumSquares(const float* x, int64_t n, double* scratch, double* result,
                             const Launch& launch);
// out[i] <- fp32(1 / max(√s, eps)) · x[i] with s = *sum_squares (device, float64, as
// LaunchSumSquares leaves it), the factor computed in float64 and rounded once. `out` may be `x`.
cudaError_t LaunchScaleByInverseNorm(const double* sum_squares, float eps, const float* x,
                                     float* out, int64_t n, const Launch& launch);

}  // namespace gpu
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_ELEMENTWISE_KERNELS_H_
