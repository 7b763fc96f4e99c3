// Element-wise CUDA kernels of the emerging optimizers over kernels/math/emerging.h. Compiled
// with --fmad=false (see BUILD) like elementwise_kernels.cu, so that every element equals the
// CPU device's result bit for bit.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/update_kernels.h"
#include "kernels/math/emerging.h"

namespace optstep {
namespace gpu {
namespace {

using internal::Blocks;
using internal::FirstIndex;
using internal::Stride;

__global__ void LionKernel(math::LionArgs a, const float* __restrict__ g, float* __restrict__ p,
                           float* __restrict__ m, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) math::LionElement(a, g[i], p[i], m[i]);
}

__global__ void MuonMomentumKernel(math::MuonMomentumArgs a, const float* __restrict__ g,
                                   float* __restrict__ p, float* __restrict__ b,
                                   float* __restrict__ u, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    math::MuonMomentumElement(a, g[i], p[i], b[i], u[i]);
  }
}

__global__ void AdamuonKernel(math::Moment2Args a, const float* __restrict__ o,
                              float* __restrict__ p, float* __restrict__ v, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) math::AdamuonElement(a, o[i], p[i], v[i]);
}

__global__ void NormuonMomentKernel(math::Moment2Args a, const float* __restrict__ s,
                                    float* __restrict__ v, float* __restrict__ w, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    math::NormuonMomentElement(a, s[i], v[i], w[i]);
  }
}

__global__ void SoapAdamKernel(math::SoapAdamArgs a, const float* __restrict__ g,
                               float* __restrict__ m, float* __restrict__ v,
                               float* __restrict__ d, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) {
    math::SoapAdamElement(a, g[i], m[i], v[i], d[i]);
  }
}

__global__ void AxpbyKernel(float alpha, const float* x, float beta, float* y, int64_t n) {
  for (int64_t i = FirstIndex(); i < n; i += Stride()) math::AxpbyElement(alpha, x[i], beta, y[i]);
}

}  // namespace

cudaError_t LaunchLion(const math::LionArgs& args, const float* grad, float* param,
                       float* exp_avg, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  LionKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(args, grad, param,
                                                                        exp_avg, n);
  return cudaGetLastError();
}

cudaError_t LaunchMuonMomentum(const math::MuonMomentumArgs& args, const float* grad,
                               float* param, float* momentum, float* update, int64_t n,
                               const Launch& launch) {
  if (n == 0) return cudaSuccess;
  MuonMomentumKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(
      args, grad, param, momentum, update, n);
  return cudaGetLastError();
}

cudaError_t LaunchAdamuon(const math::Moment2Args& args, const float* update, float* param,
                          float* moment, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  AdamuonKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(args, update, param,
                                                                           moment, n);
  return cudaGetLastError();
}

cudaError_t LaunchNormuonMoment(const math::Moment2Args& args, const float* sum_squares,
                                float* moment, float* scale, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  NormuonMomentKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(
      args, sum_squares, moment, scale, n);
  return cudaGetLastError();
}

cudaError_t LaunchSoapAdam(const math::SoapAdamArgs& args, const float* grad, float* exp_avg,
                           float* exp_avg_sq, float* direction, int64_t n, const Launch& launch) {
  if (n == 0) return cudaSuccess;
  SoapAdamKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(
      args, grad, exp_avg, exp_avg_sq, direction, n);
  return cudaGetLastError();
}

cudaError_t LaunchAxpby(float alpha, const float* x, float beta, float* y, int64_t n,
                        const Launch& launch) {
  if (n == 0) return cudaSuccess;
  AxpbyKernel<<<Blocks(n, launch), kThreadsPerBlock, 0, launch.stream>>>(alpha, x, beta, y, n);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace optstep
