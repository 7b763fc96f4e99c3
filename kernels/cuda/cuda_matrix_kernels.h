#ifndef OPTSTEP_KERNELS_CUDA_CUDA_MATRIX_KERNELS_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_MATRIX_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/matrix_kernels.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {
namespace internal {
struct CudaContext;  // cuda_context.h
}  // namespace internal

// The matrix primitives of CudaDevice: data movement as the kernels of matrix_kernels.cu
// (cuda_device_emerging.cc); GEMMs through cuBLAS (fp32 COMPUTE_32F for kHighest,
// COMPUTE_32F_FAST_TF32 for kHigh, COMPUTE_32F_FAST_16BF for kMedium on fp32 tensors, bf16 A/B/C
// with COMPUTE_32F for bf16 tensors); eigendecomposition (syevd) and QR (geqrf + orgqr) through
// cuSOLVER (cuda_device_linalg.cc). All work goes to the device's stream; SymmetricEigh, Qr and
// Permute wait for it (solver status, small host-side decisions). This header includes no CUDA
// header.
//
// Thread safety: as Device; every method first makes the device current (cudaSetDevice).
class CudaMatrixKernels final : public MatrixKernels {
 public:
  // `ctx` outlives this object (both are owned by the CudaDevice).
  explicit CudaMatrixKernels(const internal::CudaContext* ctx) : ctx_(ctx) {}

  CudaMatrixKernels(const CudaMatrixKernels&) = delete;
  CudaMatrixKernels& operator=(const CudaMatrixKernels&) = delete;

  absl::Status Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) override;
  absl::Status Transpose(const Tensor& src, Tensor& dst) override;
  absl::Status CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src, Tensor& dst) override;
  absl::Status AxisDot(const Tensor& a, const Tensor& b, Tensor& out) override;
  absl::Status AxisScale(const Tensor& v, Tensor& x) override;
  absl::Status Permute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                       Tensor& dst) override;
  absl::Status SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                             Tensor& eigenvectors) override;
  absl::Status Qr(const Tensor& a, Tensor& q) override;

 private:
  const internal::CudaContext* const ctx_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_MATRIX_KERNELS_H_
