#ifndef OPTSTEP_KERNELS_CUDA_UPDATE_KERNELS_H_
#define OPTSTEP_KERNELS_CUDA_UPDATE_KERNELS_H_

// Plain launchers of the element-wise CUDA kernels of the emerging optimizers
// (update_kernels.cu), over the formulas of kernels/math/emerging.h. Host code sees only these
// declarations. Each enqueues on launch.stream and returns the launch status; pointers are device
// pointers; nothing is validated here (CudaDevice validates on the host first). Thread-safe.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/math/emerging.h"

namespace optstep {
namespace gpu {

cudaError_t LaunchLion(const math::LionArgs& args, const float* grad, float* param, float* exp_avg,
                       int64_t n, const Launch& launch);
cudaError_t LaunchMuonMomentum(const math::MuonMomentumArgs& args, const float* grad, float* param,
                               float* momentum, float* update, int64_t n, const Launch& launch);
cudaError_t LaunchAdamuon(const math::Moment2Args& args, const float* update, float* param,
                          float* moment, int64_t n, const Launch& launch);
cudaError_t LaunchNormuonMoment(const math::Moment2Args& args, const float* sum_squares,
                                float* moment, float* scale, int64_t n, const Launch& launch);
cudaError_t LaunchSoapAdam(const math::SoapAdamArgs& args, const float* grad, float* exp_avg,
                           float* exp_avg_sq, float* direction, int64_t n, const Launch& launch);
// y ← α·x + β·y (x may be y; y not read when β == 0).
cudaError_t LaunchAxpby(float alpha, const float* x, float beta, float* y, int64_t n,
                        const Launch& launch);

}  // namespace gpu
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_UPDATE_KERNELS_H_
