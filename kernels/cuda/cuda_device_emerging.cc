// CudaUpdateKernels: the element-wise updates of the emerging optimizers (formulas in
// kernels/math/emerging.h); CudaDevice: Axpby and Convert; CudaMatrixKernels: the data-movement
// primitives (Transpose, CopyRowBlocks, AxisDot, AxisScale, Permute). See cuda_device.h.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/status_macros.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/matrix_kernels.h"
#include "kernels/cuda/update_kernels.h"
#include "kernels/emerging_validation.h"
#include "kernels/matrix_validation.h"

namespace optstep {

absl::Status CudaUpdateKernels::Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                                     Tensor& exp_avg) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckLion(args, grad, param, exp_avg));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchLion(args, grad.f32(), param.f32(), exp_avg.f32(), grad.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad,
                                             Tensor& param, Tensor& momentum, Tensor& update) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckMuonMomentum(args, grad, param, momentum, update));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchMuonMomentum(
      args, grad.f32(), param.f32(), momentum.f32(), update.f32(), grad.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::Adamuon(const math::Moment2Args& args, const Tensor& update,
                                        Tensor& param, Tensor& moment) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAdamuon(args, update, param, moment));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAdamuon(args, update.f32(), param.f32(), moment.f32(),
                                                  update.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::NormuonMoment(const math::Moment2Args& args,
                                              const Tensor& sum_squares, Tensor& moment,
                                              Tensor& scale) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckNormuonMoment(args, sum_squares, moment, scale));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchNormuonMoment(
      args, sum_squares.f32(), moment.f32(), scale.f32(), moment.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad,
                                         Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& direction) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSoapAdam(args, grad, exp_avg, exp_avg_sq, direction));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchSoapAdam(args, grad.f32(), exp_avg.f32(),
                                                   exp_avg_sq.f32(), direction.f32(), grad.numel(),
                                                   ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaDevice::Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxpby(alpha, x, beta, y));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchAxpby(alpha, x.f32(), beta, y.f32(), y.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaDevice::Convert(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckConvert(src, dst));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  const gpu::Launch launch = ctx_->launch();
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(),
                                                 cudaMemcpyDeviceToDevice, launch.stream));
    return absl::OkStatus();
  }
  const uint16_t* half_src = static_cast<const uint16_t*>(src.data());
  uint16_t* half_dst = static_cast<uint16_t*>(dst.data());
  cudaError_t error = cudaSuccess;
  if (src.dtype() == DType::kBF16) {
    error = gpu::LaunchBf16ToF32(half_src, dst.f32(), n, launch);
  } else if (src.dtype() == DType::kF16) {
    error = gpu::LaunchF16ToF32(half_src, dst.f32(), n, launch);
  } else if (dst.dtype() == DType::kBF16) {
    error = gpu::LaunchF32ToBf16(src.f32(), half_dst, n, launch);
  } else {
    error = gpu::LaunchF32ToF16(src.f32(), half_dst, n, launch);
  }
  OPTSTEP_CUDA_RETURN_IF_ERROR(error);
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::Transpose(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckTranspose(src, dst));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchTranspose(src.f32(), dst.f32(), src.dim(0), src.dim(1), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src,
                                              Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckRowBlockCopy(copy, src, dst));
  if (copy.num_blocks == 0 || copy.block_rows == 0 || src.dim(1) == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  const size_t row_bytes = static_cast<size_t>(src.dim(1)) * sizeof(float);
  // One strided 2-D copy: each "row" of the copy is one block of rows. Validation made the
  // strides at least block_rows when there are several blocks; with one block the pitch is
  // unused but must not be below the width.
  const int64_t dst_pitch = std::max(copy.dst_block_stride, copy.block_rows);
  const int64_t src_pitch = std::max(copy.src_block_stride, copy.block_rows);
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
      dst.f32() + copy.dst_first_row * dst.dim(1), dst_pitch * row_bytes,
      src.f32() + copy.src_first_row * src.dim(1), src_pitch * row_bytes,
      copy.block_rows * row_bytes, copy.num_blocks, cudaMemcpyDeviceToDevice, ctx_->stream->get()));
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::AxisDot(const Tensor& a, const Tensor& b, Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxisDot(a, b, out));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAxisDot(a.f32(), b.f32(), out.f32(), a.dim(0), a.dim(1),
                                                  internal::PerRow(out, a), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::AxisScale(const Tensor& v, Tensor& x) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxisScale(v, x));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAxisScale(v.f32(), x.f32(), x.dim(0), x.dim(1),
                                                    internal::PerRow(v, x), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::Permute(const Tensor& src, int axis,
                                        const std::vector<int64_t>& perm, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckPermute(src, axis, perm, dst));
  if (perm.empty()) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  internal::StreamScratch index(stream);
  OPTSTEP_RETURN_IF_ERROR(index.Allocate(perm.size() * sizeof(int64_t)));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(index.as<int64_t>(), perm.data(),
                                               perm.size() * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchPermute(src.f32(), index.as<int64_t>(), dst.f32(),
                                                  src.dim(0), src.dim(1), axis, ctx_->launch()));
  // `perm` is pageable host memory that the caller may free at once.
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace optstep
