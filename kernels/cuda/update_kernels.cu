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

using internal::Aligned16;
using internal::ForEachElement;
using internal::LaunchElementwise;

// Inputs go into ForEachElement's pointer list too; it never writes them.
__device__ __forceinline__ float* In(const float* p) { return const_cast<float*>(p); }

template <bool kVector>
__global__ void LionKernel(math::LionArgs a, const float* g, float* p, float* m, int64_t n) {
  float* const ptrs[] = {In(g), p, m};
  ForEachElement<1, 2, 0, kVector>(n, ptrs,
                                   [&a](float(&v)[3]) { math::LionElement(a, v[0], v[1], v[2]); });
}

template <bool kVector>
__global__ void MuonMomentumKernel(math::MuonMomentumArgs a, const float* g, float* p, float* b,
                                   float* u, int64_t n) {
  float* const ptrs[] = {In(g), p, b, u};
  ForEachElement<1, 2, 1, kVector>(
      n, ptrs, [&a](float(&v)[4]) { math::MuonMomentumElement(a, v[0], v[1], v[2], v[3]); });
}

template <bool kVector>
__global__ void AdamuonKernel(math::Moment2Args a, const float* o, float* p, float* v2, int64_t n) {
  float* const ptrs[] = {In(o), p, v2};
  ForEachElement<1, 2, 0, kVector>(
      n, ptrs, [&a](float(&v)[3]) { math::AdamuonElement(a, v[0], v[1], v[2]); });
}

template <bool kVector>
__global__ void NormuonMomentKernel(math::Moment2Args a, const float* s, float* v2, float* w,
                                    int64_t n) {
  float* const ptrs[] = {In(s), v2, w};
  ForEachElement<1, 1, 1, kVector>(
      n, ptrs, [&a](float(&v)[3]) { math::NormuonMomentElement(a, v[0], v[1], v[2]); });
}

template <bool kVector>
__global__ void SoapAdamKernel(math::SoapAdamArgs a, const float* g, float* m, float* v2, float* d,
                               int64_t n) {
  float* const ptrs[] = {In(g), m, v2, d};
  ForEachElement<1, 2, 1, kVector>(
      n, ptrs, [&a](float(&v)[4]) { math::SoapAdamElement(a, v[0], v[1], v[2], v[3]); });
}

// With β == 0, y is written and never read (math::AxpbyElement).
template <bool kVector, bool kReadY>
__global__ void AxpbyKernel(float alpha, const float* x, float beta, float* y, int64_t n) {
  float* const ptrs[] = {In(x), y};
  auto element = [alpha, beta](float(&v)[2]) { math::AxpbyElement(alpha, v[0], beta, v[1]); };
  if (kReadY) {
    ForEachElement<1, 1, 0, kVector>(n, ptrs, element);
  } else {
    ForEachElement<1, 0, 1, kVector>(n, ptrs, element);
  }
}

}  // namespace

cudaError_t LaunchLion(const math::LionArgs& args, const float* grad, float* param,
                       float* exp_avg, int64_t n, const Launch& launch) {
  return LaunchElementwise(LionKernel<true>, LionKernel<false>,
                           Aligned16(grad) && Aligned16(param) && Aligned16(exp_avg), n, launch,
                           args, grad, param, exp_avg);
}

cudaError_t LaunchMuonMomentum(const math::MuonMomentumArgs& args, const float* grad,
                               float* param, float* momentum, float* update, int64_t n,
                               const Launch& launch) {
  const bool aligned =
      Aligned16(grad) && Aligned16(param) && Aligned16(momentum) && Aligned16(update);
  return LaunchElementwise(MuonMomentumKernel<true>, MuonMomentumKernel<false>, aligned, n, launch,
                           args, grad, param, momentum, update);
}

cudaError_t LaunchAdamuon(const math::Moment2Args& args, const float* update, float* param,
                          float* moment, int64_t n, const Launch& launch) {
  return LaunchElementwise(AdamuonKernel<true>, AdamuonKernel<false>,
                           Aligned16(update) && Aligned16(param) && Aligned16(moment), n, launch,
                           args, update, param, moment);
}

cudaError_t LaunchNormuonMoment(const math::Moment2Args& args, const float* sum_squares,
                                float* moment, float* scale, int64_t n, const Launch& launch) {
  return LaunchElementwise(NormuonMomentKernel<true>, NormuonMomentKernel<false>,
                           Aligned16(sum_squares) && Aligned16(moment) && Aligned16(scale), n,
                           launch, args, sum_squares, moment, scale);
}

cudaError_t LaunchSoapAdam(const math::SoapAdamArgs& args, const float* grad, float* exp_avg,
                           float* exp_avg_sq, float* direction, int64_t n, const Launch& launch) {
  const bool aligned =
      Aligned16(grad) && Aligned16(exp_avg) && Aligned16(exp_avg_sq) && Aligned16(direction);
  return LaunchElementwise(SoapAdamKernel<true>, SoapAdamKernel<false>, aligned, n, launch, args,
                           grad, exp_avg, exp_avg_sq, direction);
}

cudaError_t LaunchAxpby(float alpha, const float* x, float beta, float* y, int64_t n,
                        const Launch& launch) {
  const bool aligned = Aligned16(x) && Aligned16(y);
  if (beta == 0.0f) {
    return LaunchElementwise(AxpbyKernel<true, false>, AxpbyKernel<false, false>, aligned, n,
                             launch, alpha, x, beta, y);
  }
  return LaunchElementwise(AxpbyKernel<true, true>, AxpbyKernel<false, true>, aligned, n, launch,
                           alpha, x, beta, y);
}

}  // namespace gpu
}  // namespace optstep
