#ifndef OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_
#define OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/cpu_gemm_backend.h"
#include "kernels/cpu/dnnl_gemm.h"
#include "kernels/matrix_kernels.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {

// The matrix primitives of CpuDevice: data movement as OpenMP loops (cpu_device_emerging.cc);
// fp32 GEMMs through OpenBLAS, split into blocks of rows or columns of C, one single-threaded
// sgemm per thread; kMedium GEMMs (bf16 inputs, fp32 accumulation; bf16 outputs rounded once from
// the fp32 result) through oneDNN's bf16 matmul with the backend kOneDnn (cpu_gemm_backend.h),
// else through the same OpenBLAS path on inputs rounded to bf16 (Debian's OpenBLAS has no bf16
// GEMM); symmetric products (SymmetricGemm) in panels on and above the diagonal, one
// single-threaded product per panel, pairs of panels per thread, then mirrored; symmetric
// eigendecomposition (ssyevd, dsyevd as the fallback) and QR (sgeqrf + sorgqr) through LAPACKE, on
// one thread (cpu_device_linalg.cc). Every method runs to completion before it returns.
//
// Thread safety: thread-compatible, as Device (the GEMM scratch buffers are reused between calls).
// Owned by its CpuDevice.
class CpuMatrixKernels final : public MatrixKernels {
 public:
  // kOneDnn: oneDNN keeps up to `dnnl_max_primitives` primitives (internal::DnnlGemm).
  CpuMatrixKernels(internal::CpuContext ctx, CpuGemmBackend backend,
                   size_t dnnl_max_primitives = internal::DnnlGemm::kMaxPrimitives);

  CpuMatrixKernels(const CpuMatrixKernels&) = delete;
  CpuMatrixKernels& operator=(const CpuMatrixKernels&) = delete;

  absl::Status Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) override;
  absl::Status SymmetricGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                             Tensor& c) override;
  // Device::GemmFrom on this device: C ← α·op(A)·op(B) + β·D with the bits of Copy(d, c) and
  // then Gemm / SymmetricGemm. Where this class splits the product itself (SymmetricGemm's panels;
  // kMedium products of an untransposed A on oneDNN, in blocks of rows of C), every thread copies
  // the part of D that its own rows of C read, inside the product's parallel region; elsewhere D
  // is copied first. REQUIRES: d of c's shape and dtype (the caller checks).
  absl::Status GemmFrom(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& d,
                        Tensor& c);
  absl::Status SymmetricGemmFrom(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                 const Tensor& d, Tensor& c);
  absl::Status Transpose(const Tensor& src, Tensor& dst) override;
  absl::Status CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src, Tensor& dst) override;
  absl::Status AxisDot(const Tensor& a, const Tensor& b, Tensor& out) override;
  absl::Status AxisScale(const Tensor& v, Tensor& x) override;
  absl::Status Permute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                       Tensor& dst) override;
  absl::Status SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                             Tensor& eigenvectors) override;
  absl::Status Qr(const Tensor& a, Tensor& q) override;

  CpuGemmBackend gemm_backend() const { return backend_; }
  // The library that ran the last non-empty GEMM: "openblas", or "onednn:" and oneDNN's
  // implementation name (e.g. "onednn:brg:avx512_core_bf16"; after a SymmetricGemm, the distinct
  // names of its panels joined by ", "); "" before the first.
  const std::string& last_gemm_library() const { return last_gemm_library_; }
  // The oneDNN GEMMs (their primitive cache), or null with kOpenBlas.
  const internal::DnnlGemm* dnnl() const { return dnnl_.get(); }

 private:
  // kMedium through oneDNN: C{m, n} ← α·op(A)·op(B) + β·C for fp32 or bf16 tensors.
  // REQUIRES: dnnl_ set; m, n, k >= 1.
  absl::Status OneDnnGemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c);
  // OneDnnGemm with β·D, in blocks of rows of C on the device's threads, each one single-threaded
  // product after the copy of its rows of D. REQUIRES: as OneDnnGemm; A not transposed.
  absl::Status OneDnnGemmRowsFrom(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                  const Tensor& d, Tensor& c);
  // SymmetricGemm with β·D (`d` set) or β·C (`d` null).
  absl::Status Symmetric(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor* d,
                         Tensor& c);
  // t's elements as bf16: t's own data, or t rounded to nearest even into Bf16Scratch(slot).
  // REQUIRES: t fp32 or bf16.
  const uint16_t* Bf16Operand(const Tensor& t, int slot);
  // The fp32 inputs of an OpenBLAS product: a's and b's data, or under kMedium their values
  // rounded to bf16 in GemmScratch(0) and (1) (one copy when b is a). REQUIRES: fp32 tensors.
  std::pair<const float*, const float*> Fp32Operands(const GemmArgs& args, const Tensor& a,
                                                     const Tensor& b);
  // bf16 copies of fp32 inputs (slots 0, 1) and transposed bf16 operands of SymmetricGemm's
  // panels (2, 3): grown on demand, reused.
  std::vector<uint16_t>& Bf16Scratch(int slot, int64_t n);
  // SymmetricGemm's dense panel blocks on oneDNN: `bytes` bytes, grown on demand, reused.
  char* BlockScratch(int64_t bytes);

  // Host copies that a GEMM needs (kMedium rounding, bf16 widening): grown on demand, reused.
  std::vector<float>& GemmScratch(int slot, int64_t n);

  const internal::CpuContext ctx_;
  const CpuGemmBackend backend_;
  std::unique_ptr<internal::DnnlGemm> dnnl_;  // set with kOneDnn
  std::vector<float> gemm_scratch_[3];
  std::vector<uint16_t> bf16_scratch_[4];
  std::vector<char> block_scratch_;
  std::string last_gemm_library_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_MATRIX_KERNELS_H_
