// CudaMatrixKernels: GEMM through cuBLAS, symmetric eigendecomposition and QR through cuSOLVER.
// See cuda_device.h.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_libraries.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/matrix_kernels.h"
#include "kernels/matrix_validation.h"

namespace optstep {
namespace {

int AsInt(int64_t v) { return static_cast<int>(std::max<int64_t>(1, v)); }

cublasComputeType_t ComputeType(const GemmArgs& args, bool bf16) {
  if (bf16) return CUBLAS_COMPUTE_32F;
  switch (args.precision) {
    case MatmulPrecision::kHigh:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case MatmulPrecision::kMedium:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case MatmulPrecision::kHighest:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

absl::Status CudaMatrixKernels::Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                     Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckGemm(args, a, b, c));
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = args.transpose_a ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  const bool bf16 = a.dtype() == DType::kBF16;
  const cudaDataType type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, and a row-major matrix read
  // column-major is its transpose: swap the operands, keep the flags.
  OPTSTEP_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(ctx_->libs->cublas(), args.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   args.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &args.alpha, b.data(), type,
                   AsInt(b.dim(1)), a.data(), type, AsInt(a.dim(1)), &args.beta, c.data(), type,
                   AsInt(n), ComputeType(args, bf16), CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                                              Tensor& eigenvectors) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSymmetricEigh(a, shift, eigenvalues, eigenvectors));
  const int64_t n = a.dim(0);
  if (n == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  const gpu::Launch launch = ctx_->launch();
  std::vector<float> values(n);

  // Exactly diagonal: identity columns in the stable descending order of the diagonal.
  internal::StreamScratch flag(stream);
  OPTSTEP_RETURN_IF_ERROR(flag.Allocate(sizeof(unsigned int)));
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(flag.as<unsigned int>(), 0, sizeof(unsigned int), stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchOffDiagonalFlag(a.f32(), n, flag.as<unsigned int>(), launch));
  unsigned int off_diagonal = 0;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&off_diagonal, flag.as<unsigned int>(),
                                               sizeof(off_diagonal), cudaMemcpyDeviceToHost,
                                               stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (off_diagonal == 0) {
    std::vector<float> diagonal(n);
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(diagonal.data(), sizeof(float), a.f32(),
                                                   (n + 1) * sizeof(float), sizeof(float), n,
                                                   cudaMemcpyDeviceToHost, stream));
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t i, int64_t j) { return diagonal[i] > diagonal[j]; });
    for (int64_t j = 0; j < n; ++j) values[j] = diagonal[order[j]];
    internal::StreamScratch perm(stream);
    OPTSTEP_RETURN_IF_ERROR(perm.Allocate(n * sizeof(int64_t)));
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        perm.as<int64_t>(), order.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
    OPTSTEP_CUDA_RETURN_IF_ERROR(
        gpu::LaunchPermutedIdentity(perm.as<int64_t>(), eigenvectors.f32(), n, launch));
  } else {
    // The solver works on a column-major copy; the symmetric matrix reads the same, and its
    // lower triangle (column-major) is the upper triangle of the row-major input.
    cusolverDnHandle_t solver = ctx_->libs->cusolver();
    const int ni = static_cast<int>(n);
    internal::StreamScratch work(stream), w(stream), info(stream);
    OPTSTEP_RETURN_IF_ERROR(work.Allocate(n * n * sizeof(float)));
    OPTSTEP_RETURN_IF_ERROR(w.Allocate(n * sizeof(double)));
    OPTSTEP_RETURN_IF_ERROR(info.Allocate(sizeof(int)));
    auto shifted = [&]() -> absl::Status {
      OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(work.as<float>(), a.f32(), n * n * sizeof(float),
                                                   cudaMemcpyDeviceToDevice, stream));
      OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAddDiagonal(work.as<float>(), n, shift, launch));
      return absl::OkStatus();
    };
    OPTSTEP_RETURN_IF_ERROR(shifted());
    int lwork = 0;
    OPTSTEP_CUSOLVER_RETURN_IF_ERROR(
        cusolverDnSsyevd_bufferSize(solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, ni,
                                    work.as<float>(), ni, w.as<float>(), &lwork));
    internal::StreamScratch buffer(stream);
    OPTSTEP_RETURN_IF_ERROR(buffer.Allocate(std::max(1, lwork) * sizeof(float)));
    OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSsyevd(
        solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, ni, work.as<float>(), ni,
        w.as<float>(), buffer.as<float>(), lwork, info.as<int>()));
    int status = 0;
    OPTSTEP_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&status, info.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream));
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    std::vector<double> ascending(n);
    if (status == 0) {
      std::vector<float> w32(n);
      OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(w32.data(), w.as<float>(), n * sizeof(float),
                                                   cudaMemcpyDeviceToHost, stream));
      OPTSTEP_CUDA_RETURN_IF_ERROR(
          gpu::LaunchEigenvectorsDescending(work.as<float>(), eigenvectors.f32(), n, launch));
      OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      std::copy(w32.begin(), w32.end(), ascending.begin());
    } else {
      // Retry the same shifted fp32 matrix in fp64.
      OPTSTEP_RETURN_IF_ERROR(shifted());
      internal::StreamScratch dwork(stream);
      OPTSTEP_RETURN_IF_ERROR(dwork.Allocate(n * n * sizeof(double)));
      OPTSTEP_CUDA_RETURN_IF_ERROR(
          gpu::LaunchF32ToF64(work.as<float>(), dwork.as<double>(), n * n, launch));
      int dlwork = 0;
      OPTSTEP_CUSOLVER_RETURN_IF_ERROR(
          cusolverDnDsyevd_bufferSize(solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, ni,
                                      dwork.as<double>(), ni, w.as<double>(), &dlwork));
      internal::StreamScratch dbuffer(stream);
      OPTSTEP_RETURN_IF_ERROR(dbuffer.Allocate(std::max(1, dlwork) * sizeof(double)));
      OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnDsyevd(
          solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, ni, dwork.as<double>(), ni,
          w.as<double>(), dbuffer.as<double>(), dlwork, info.as<int>()));
      OPTSTEP_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(&status, info.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, stream));
      OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          ascending.data(), w.as<double>(), n * sizeof(double), cudaMemcpyDeviceToHost, stream));
      OPTSTEP_CUDA_RETURN_IF_ERROR(
          gpu::LaunchEigenvectorsDescending(dwork.as<double>(), eigenvectors.f32(), n, launch));
      OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      if (status != 0) {
        return absl::InternalError(
            absl::StrCat("SymmetricEigh: cusolver syevd failed in fp32 and "
                         "fp64 on a ",
                         n, "x", n, " matrix (info ", status, ")"));
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      values[j] = static_cast<float>(ascending[n - 1 - j] - static_cast<double>(shift));
    }
  }
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(eigenvalues.f32(), values.data(), n * sizeof(float),
                                               cudaMemcpyHostToDevice, stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `values` is about to go
  return absl::OkStatus();
}

absl::Status CudaMatrixKernels::Qr(const Tensor& a, Tensor& q) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckQr(a, q));
  const int64_t m = a.dim(0);
  const int64_t n = a.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  const gpu::Launch launch = ctx_->launch();
  cusolverDnHandle_t solver = ctx_->libs->cusolver();
  const int mi = static_cast<int>(m);
  const int ni = static_cast<int>(n);
  // Column-major {m, n} = the row-major transpose {n, m}.
  internal::StreamScratch cm(stream), tau(stream), info(stream);
  OPTSTEP_RETURN_IF_ERROR(cm.Allocate(m * n * sizeof(float)));
  OPTSTEP_RETURN_IF_ERROR(tau.Allocate(n * sizeof(float)));
  OPTSTEP_RETURN_IF_ERROR(info.Allocate(2 * sizeof(int)));
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchTranspose(a.f32(), cm.as<float>(), m, n, launch));
  int lwork_qr = 0, lwork_q = 0;
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(
      cusolverDnSgeqrf_bufferSize(solver, mi, ni, cm.as<float>(), mi, &lwork_qr));
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSorgqr_bufferSize(solver, mi, ni, ni, cm.as<float>(),
                                                               mi, tau.as<float>(), &lwork_q));
  const int lwork = std::max({1, lwork_qr, lwork_q});
  internal::StreamScratch buffer(stream);
  OPTSTEP_RETURN_IF_ERROR(buffer.Allocate(lwork * sizeof(float)));
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSgeqrf(solver, mi, ni, cm.as<float>(), mi,
                                                    tau.as<float>(), buffer.as<float>(), lwork,
                                                    info.as<int>()));
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSorgqr(solver, mi, ni, ni, cm.as<float>(), mi,
                                                    tau.as<float>(), buffer.as<float>(), lwork,
                                                    info.as<int>() + 1));
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchTranspose(cm.as<float>(), q.f32(), n, m, launch));
  int status[2] = {0, 0};
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(status, info.as<int>(), sizeof(status), cudaMemcpyDeviceToHost, stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (status[0] != 0 || status[1] != 0) {
    return absl::InternalError(absl::StrCat("Qr: cusolver geqrf/orgqr failed on a ", m, "x", n,
                                            " matrix (info ", status[0], ", ", status[1], ")"));
  }
  return absl::OkStatus();
}

}  // namespace optstep
