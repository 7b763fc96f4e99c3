#ifndef OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_
#define OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/matrix_kernels.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {

// The matrix primitives of CpuDevice: data movement as OpenMP loops (cpu_device_emerging.cc);
// GEMMs through OpenBLAS (fp32; kMedium rounds the inputs to bf16 first, since Debian's OpenBLAS
// has no bf16 GEMM, and bf16 outputs are rounded from the fp32 result), split into blocks of rows
// or columns of C, one single-threaded sgemm per thread; symmetric eigendecomposition (ssyevd,
// dsyevd as the fallback) and QR (sgeqrf + sorgqr) through LAPACKE, on one thread
// (cpu_device_linalg.cc). Every method runs to completion before it returns.
//
// Thread safety: thread-compatible, as Device (the GEMM scratch buffers are reused between calls).
// Owned by its CpuDevice.
class CpuMatrixKernels final : public MatrixKernels {
 public:
  explicit CpuMatrixKernels(internal::CpuContext ctx) : ctx_(ctx) {}

  CpuMatrixKernels(const CpuMatrixKernels&) = delete;
  CpuMatrixKernels& operator=(const CpuMatrixKernels&) = delete;

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
  // Host copies that a GEMM needs (kMedium rounding, bf16 widening): grown on demand, reused.
  std::vector<float>& GemmScratch(int slot, int64_t n);

  const internal::CpuContext ctx_;
  std::vector<float> gemm_scratch_[3];
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_
