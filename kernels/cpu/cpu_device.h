#ifndef OPTSTEP_KERNELS_CPU_CPU_DEVICE_H_
#define OPTSTEP_KERNELS_CPU_CPU_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_context.h"
#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/cpu/cpu_gemm_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_matrix_kernels.h"
#include "kernels/cpu/cpu_update_kernels.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace optstep {

// The CPU implementation of Device: 64-byte aligned host memory and OpenMP loops over the
// per-element formulas of kernels/math (one source of truth with the CUDA kernels). It owns a
// CpuUpdateKernels (the optimizer updates) and a CpuMatrixKernels (GEMM through OpenBLAS,
// eigendecomposition and QR through LAPACKE), which share its thread count (CpuContext).
//
// Source files: cpu_device.cc (memory, transfers, and the kernels Adam, SGD),
// cpu_device_emerging.cc (the element-wise and data-movement primitives of the emerging
// optimizers), cpu_device_linalg.cc (OpenBLAS / LAPACKE).
//
// The element-wise loops (updates, conversions, sums) come from the table of one instruction-set
// variant (cpu_elementwise.h), chosen at Create from CPUID or Options::isa / OPTSTEP_CPU_ISA;
// every variant computes the same bits.
//
// Every method runs to completion before it returns; Synchronize() has nothing to wait for.
// Loops over at least CpuContext::kMinParallelElements elements are split into `num_threads`
// contiguous, 64-byte aligned ranges (static partition); smaller ones run on the calling thread.
// GEMMs are split the same way (blocks of rows or columns of C, one single-threaded sgemm per
// thread): Create sets OpenBLAS to one thread (process-wide), so that OpenBLAS's pool and OpenMP's
// never spin against each other between calls; LAPACK (eigh, QR) therefore runs on one thread.
//
// Thread safety: as Device. Allocate, allocated_bytes, CopyFromHost, AddFromHost (on disjoint
// ranges) and CopyToHost are thread-safe (atomic accounting, no shared mutable state); the other
// methods are thread-compatible.
//
// Ownership: tensors own their memory and may outlive the device that allocated them; the
// accounting they release on destruction is shared with the device.
class CpuDevice final : public Device {
 public:
  struct Options {
    // OpenMP threads per parallel loop; 0 = omp_get_max_threads() (all cores by default).
    int num_threads = 0;
    // Allocate answers RESOURCE_EXHAUSTED when the tensors held would exceed this many bytes;
    // 0 = no limit beyond the host's memory.
    int64_t memory_limit_bytes = 0;
    // The element-wise loops' variant: "baseline", "avx2" or "avx512" (cpu_isa.h), at most the
    // widest this CPU supports; empty = the environment's OPTSTEP_CPU_ISA, or when that is unset
    // or empty, the widest.
    std::string isa;
    // The library of the bf16-class GEMMs (cpu_gemm_backend.h): "auto", "openblas" or "onednn";
    // empty = the environment's OPTSTEP_CPU_GEMM, or "auto" when that is unset.
    std::string gemm;
  };

  // Alignment of every allocation, in bytes.
  static constexpr int64_t kAlignment = 64;
  // ComputeGradientStats partitions the tensor into blocks of this many elements. Within a
  // block, kStatsLanes float64 partial sums take the elements i ≡ lane (mod kStatsLanes) in
  // order and are then added lane 0 first; the block sums are added in block order. The result
  // therefore depends only on the data, never on the thread count.
  static constexpr int64_t kStatsBlockElements = 1 << 16;
  static constexpr int kStatsLanes = internal::kSumSquaresLanes;

  // INVALID_ARGUMENT for a negative num_threads or memory_limit_bytes, or an `isa` (or
  // OPTSTEP_CPU_ISA) that names no variant or one this CPU cannot run, or a `gemm` (or
  // OPTSTEP_CPU_GEMM) that names no backend or "onednn" where oneDNN finds no bf16 instructions.
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(Options options);

  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;
  ~CpuDevice() override = default;

  // The resolved thread count (>= 1).
  int num_threads() const { return ctx_.num_threads; }
  // The variant of the element-wise loops this device runs.
  CpuIsa isa() const { return ctx_.isa; }

  std::string name() const override { return "cpu"; }
  std::string cpu_isa() const override { return CpuIsaName(ctx_.isa); }
  std::string gemm_backend() const override { return CpuGemmBackendName(matrix_.gemm_backend()); }

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) override;
  int64_t allocated_bytes() const override { return allocated_->load(); }
  int64_t memory_capacity() const override { return 0; }  // host memory
  absl::Status Zero(Tensor& tensor) override;

  absl::Status CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                            int64_t dst_offset) override;
  absl::Status AddFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                           int64_t dst_offset) override;
  absl::Status CopyToHost(const Tensor& src, int64_t offset, int64_t count, DType dst_dtype,
                          void* dst) override;

  absl::Status Copy(const Tensor& src, Tensor& dst) override;
  absl::Status Add(const Tensor& src, Tensor& dst) override;
  absl::Status Scale(float scale, Tensor& x) override;

  absl::StatusOr<GradientStats> ComputeGradientStats(const Tensor& grad) override;

  absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y) override;
  absl::Status Convert(const Tensor& src, Tensor& dst) override;
  // CpuMatrixKernels::GemmFrom / SymmetricGemmFrom: the copy inside the product's region.
  absl::Status GemmFrom(const GemmArgs& args, bool symmetric, const Tensor& a, const Tensor& b,
                        const Tensor& d, Tensor& c) override;

  UpdateKernels& updates() override { return updates_; }
  MatrixKernels& matrix() override { return matrix_; }

  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  // CopyFromHost (`add` false) and AddFromHost; `op` names the method in errors.
  absl::Status FromHost(const char* op, bool add, const void* src, DType src_dtype, int64_t count,
                        Tensor& dst, int64_t dst_offset);

  CpuDevice(internal::CpuContext ctx, int64_t memory_limit_bytes, CpuGemmBackend gemm)
      : ctx_(ctx),
        memory_limit_bytes_(memory_limit_bytes),
        allocated_(std::make_shared<std::atomic<int64_t>>(0)),
        updates_(ctx),
        matrix_(ctx, gemm) {}

  // openblas_set_num_threads (cpu_device_linalg.cc), process-wide.
  static void SetBlasThreads(int num_threads);

  const internal::CpuContext ctx_;
  const int64_t memory_limit_bytes_;
  // Logical bytes (numel × dtype size) of the live tensors; shared with their deleters.
  const std::shared_ptr<std::atomic<int64_t>> allocated_;
  CpuUpdateKernels updates_;
  CpuMatrixKernels matrix_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_DEVICE_H_
