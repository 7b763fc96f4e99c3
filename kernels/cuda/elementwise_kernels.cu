// Element-wise CUDA kernels over the shared formulas of kernels/math. Compiled with --fmad=false
// (see BUILD) so that, with CUDA's IEEE division and square root, every element equals the CPU
// device's result bit for bit.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/math/elementwise.h"
#include "kernels/math/half.h"

namespace optstep {
namespace gpu {
namespace {

using internal::Aligned16;
using internal::Blocks;
using internal::FirstIndex;
using internal::Stride;

// ---- conversions and arithmetic --------------------------------------------------------------

__global__ void Bf16ToF32Kernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                                int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = math::Bf16ToFloat(src[i]);
}

__global__ void F16ToF32Kernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = math::Fp16ToFloat(src[i]);
}

__global__ void F32ToBf16Kernel(const float* __restrict__ src, uint16_t* __restrict__ dst,
                                int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = math::FloatToBf16(src[i]);
}

__global__ void F32ToF16Kernel(const float* __restrict__ src, uint16_t* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = math::FloatToFp16(src[i]);
}

__global__ void AddKernel(const float* src, float* dst, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = dst[i] + src[i];
}

__global__ void ScaleKernel(float scale, float* __restrict__ x, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) math::ScaleElement(scale, x[i]);
}

// ---- optimizer updates -----------------------------------------------------------------------
// kVector: the arrays are 16-byte aligned and the body moves float4s; the last n % 4 elements
// (or all of them when !kVector) go through the scalar loop.

template <bool kDecoupled, bool kVector>
__global__ void AdamWKernel(math::AdamWArgs a, const float* __restrict__ g, float* __restrict__ p,
                            float* __restrict__ m, float* __restrict__ v, int64_t n) {
  a.decoupled = kDecoupled;
  int64_t scalar_begin = 0;
  if (kVector) {
    const int64_t n4 = n / 4;
    for (int64_t i = FirstIndex(); i < n4; i += Stride()) {
      const float4 gg = reinterpret_cast<const float4*>(g)[i];
      float4 pp = reinterpret_cast<float4*>(p)[i];
      float4 mm = reinterpret_cast<float4*>(m)[i];
      float4 vv = reinterpret_cast<float4*>(v)[i];
      math::AdamWElement(a, gg.x, pp.x, mm.x, vv.x);
      math::AdamWElement(a, gg.y, pp.y, mm.y, vv.y);
      math::AdamWElement(a, gg.z, pp.z, mm.z, vv.z);
      math::AdamWElement(a, gg.w, pp.w, mm.w, vv.w);
      reinterpret_cast<float4*>(p)[i] = pp;
      reinterpret_cast<float4*>(m)[i] = mm;
      reinterpret_cast<float4*>(v)[i] = vv;
    }
    scalar_begin = 4 * n4;
  }
  for (int64_t i = scalar_begin + FirstIndex(); i < n; i += Stride()) {
    math::AdamWElement(a, g[i], p[i], m[i], v[i]);
  }
}

template <bool kMomentum, bool kFirstStep, bool kNesterov, bool kVector>
__global__ void SgdKernel(math::SgdArgs a, const float* __restrict__ g, float* __restrict__ p,
                          float* __restrict__ b, int64_t n) {
  if (!kMomentum) a.momentum = 0.0f;
  a.first_step = kFirstStep;
  a.nesterov = kNesterov;
  float unused = 0.0f;  // the buffer slot when there is no momentum
  int64_t scalar_begin = 0;
  if (kVector) {
    const int64_t n4 = n / 4;
    for (int64_t i = FirstIndex(); i < n4; i += Stride()) {
      const float4 gg = reinterpret_cast<const float4*>(g)[i];
      float4 pp = reinterpret_cast<float4*>(p)[i];
      float4 bb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (kMomentum && !kFirstStep) bb = reinterpret_cast<float4*>(b)[i];
      math::SgdElement(a, gg.x, pp.x, bb.x);
      math::SgdElement(a, gg.y, pp.y, bb.y);
      math::SgdElement(a, gg.z, pp.z, bb.z);
      math::SgdElement(a, gg.w, pp.w, bb.w);
      reinterpret_cast<float4*>(p)[i] = pp;
      if (kMomentum) reinterpret_cast<float4*>(b)[i] = bb;
    }
    scalar_begin = 4 * n4;
  }
  for (int64_t i = scalar_begin + FirstIndex(); i < n; i += Stride()) {
    math::SgdElement(a, g[i], p[i], kMomentum ? b[i] : unused);
  }
}

// ---- deterministic sum of squares ------------------------------------------------------------

// Sum of `value` over the block's threads, in a fixed tree order. Every thread gets the result.
__device__ double BlockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreadsPerBlock / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    SumSquaresBlocksKernel(const float* __restrict__ x, int64_t n, int64_t num_blocks,
                           double* __restrict__ block_sums) {
  __shared__ double shared[kThreadsPerBlock];
  for (int64_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const int64_t begin = b * kStatsBlockElements;
    const int64_t end = min(n, begin + kStatsBlockElements);
    // Loads go out kInFlight at a time; their squares are still added one by one, in order.
    constexpr int kInFlight = 4;
    double acc = 0.0;
    int64_t i = begin + threadIdx.x;
    for (; i + (kInFlight - 1) * kThreadsPerBlock < end; i += kInFlight * kThreadsPerBlock) {
      float v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) v[k] = x[i + k * kThreadsPerBlock];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) acc += static_cast<double>(v[k]) * v[k];
    }
    for (; i < end; i += kThreadsPerBlock) {
      const double v = x[i];
      acc += v * v;
    }
    const double total = BlockSum(acc, shared);
    if (threadIdx.x == 0) block_sums[b] = total;
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    SumBlockSumsKernel(const double* __restrict__ block_sums, int64_t num_blocks,
                       double* __restrict__ result) {
  __shared__ double shared[kThreadsPerBlock];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < num_blocks; i += kThreadsPerBlock) acc += block_sums[i];
  const double total = BlockSum(acc, shared);
  if (threadIdx.x == 0) *result = total;
}

__global__ void ScaleByInverseNormKernel(const double* __restrict__ sum_squares, float eps,
                                         const float* x, float* out, int64_t n) {
  // As the host computes it (Device::ScaleByInverseNorm): IEEE float64 sqrt and division,
  // std::max's order (a NaN norm stays NaN), one rounding to fp32.
  const double norm = sqrt(*sum_squares);
  const double eps64 = eps;
  const float factor = static_cast<float>(1.0 / (norm < eps64 ? eps64 : norm));
  for (int64_t i = FirstIndex(); i < n; i += Stride()) out[i] = factor * x[i];
}

}  // namespace

cudaError_t LaunchScaleByInverseNorm(const double* sum_squares, float eps, const float* x,
                                     float* out, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  ScaleByInverseNormKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(
      sum_squares, eps, x, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchBf16ToF32(const uint16_t* src, float* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  Bf16ToF32Kernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF16ToF32(const uint16_t* src, float* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  F16ToF32Kernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToBf16(const float* src, uint16_t* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  F32ToBf16Kernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchF32ToF16(const float* src, uint16_t* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  F32ToF16Kernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* src, float* dst, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(src, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float scale, float* x, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(scale, x, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdamW(const math::AdamWArgs& args, const float* grad, float* param,
                        float* exp_avg, float* exp_avg_sq, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  const bool vector =
      Aligned16(grad) && Aligned16(param) && Aligned16(exp_avg) && Aligned16(exp_avg_sq);
  const int blocks = Blocks(vector ? (n + 3) / 4 : n, launch);
  auto kernel = args.decoupled ? (vector ? AdamWKernel<true, true> : AdamWKernel<true, false>)
                               : (vector ? AdamWKernel<false, true> : AdamWKernel<false, false>);
  kernel<<<blocks, kThreadsPerBlock, 0, launch.stream>>>(args, grad, param, exp_avg, exp_avg_sq, n);
  return cudaGetLastError();
}

cudaError_t LaunchSgd(const math::SgdArgs& args, const float* grad, float* param, float* buffer,
                      int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  const bool momentum = args.momentum != 0.0f;
  const bool vector = Aligned16(grad) && Aligned16(param) && (!momentum || Aligned16(buffer));
  const int blocks = Blocks(vector ? (n + 3) / 4 : n, launch);
  using Kernel = void (*)(math::SgdArgs, const float*, float*, float*, int64_t);
  Kernel kernel = nullptr;
  if (!momentum) {
    kernel = vector ? SgdKernel<false, false, false, true> : SgdKernel<false, false, false, false>;
  } else if (args.first_step) {
    if (args.nesterov) {
      kernel = vector ? SgdKernel<true, true, true, true> : SgdKernel<true, true, true, false>;
    } else {
      kernel = vector ? SgdKernel<true, true, false, true> : SgdKernel<true, true, false, false>;
    }
  } else if (args.nesterov) {
    kernel = vector ? SgdKernel<true, false, true, true> : SgdKernel<true, false, true, false>;
  } else {
    kernel = vector ? SgdKernel<true, false, false, true> : SgdKernel<true, false, false, false>;
  }
  kernel<<<blocks, kThreadsPerBlock, 0, launch.stream>>>(args, grad, param, buffer, n);
  return cudaGetLastError();
}

int64_t SumSquaresScratchSize(int64_t n) {
  return std::max<int64_t>(1, (n + kStatsBlockElements - 1) / kStatsBlockElements);
}

cudaError_t LaunchSumSquares(const float* x, int64_t n, double* scratch, double* result,
                             const Launch& launch) {
  const int64_t num_blocks = (n + kStatsBlockElements - 1) / kStatsBlockElements;
  if (num_blocks > 0) {
    const int grid = static_cast<int>(std::min<int64_t>(num_blocks, launch.max_blocks));
    SumSquaresBlocksKernel<<<grid, kThreadsPerBlock, 0, launch.stream>>>(x, n, num_blocks, scratch);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  SumBlockSumsKernel<<<1, kThreadsPerBlock, 0, launch.stream>>>(scratch, num_blocks, result);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace optstep
