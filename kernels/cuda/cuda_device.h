#ifndef OPTSTEP_KERNELS_CUDA_CUDA_DEVICE_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_matrix_kernels.h"
#include "kernels/cuda/cuda_update_kernels.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace optstep {
namespace internal {
struct CudaContext;  // the device's stream and library handles (cuda_context.h)
}  // namespace internal

// The CUDA implementation of Device: cudaMalloc'ed memory and the element-wise kernels of
// elementwise_kernels.cu over the shared formulas of kernels/math. It owns a CudaUpdateKernels
// (the optimizer updates) and a CudaMatrixKernels (cuBLAS, cuSOLVER and the matrix kernels),
// which share its stream and library handles (CudaContext). This header includes no CUDA header
// and no CUDA handle leaves the device.
//
// Source files: cuda_device.cc (memory, transfers, Adam, SGD), cuda_device_emerging.cc (the
// element-wise and data-movement primitives of the emerging optimizers), cuda_device_linalg.cc
// (cuBLAS, cuSOLVER). SymmetricEigh, Qr and Permute wait for the stream (solver status, small
// host-side decisions).
//
// Ordering: all work goes to one stream. Updates (Zero, Copy, Add, Scale, AdamW, Sgd) are
// enqueued and return; methods that hand data to the host (CopyToHost, ComputeGradientStats)
// and CopyFromHost (so that `src` may be reused at once) wait for the stream. An error of
// enqueued work surfaces as INTERNAL from a later waiting call or Synchronize().
//
// Thread safety: as Device. Every method first makes this device current on the calling
// thread (cudaSetDevice); allocation accounting is atomic.
//
// Ownership: tensors own their memory and may outlive the device; their deleters share the
// stream (and wait for it before cudaFree), so that memory is never freed under running work.
class CudaDevice final : public Device {
 public:
  struct Options {
    int ordinal = 0;  // CUDA device number
  };
  // Freed stream-ordered scratch that the GPU's default memory pool keeps for reuse instead of
  // handing it back at each synchronization (cudaMemPoolAttrReleaseThreshold).
  static constexpr uint64_t kScratchPoolBytes = uint64_t{64} << 20;

  // FAILED_PRECONDITION when no CUDA device can be used (no driver, no GPU); INVALID_ARGUMENT
  // for an ordinal out of range; INTERNAL for other CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(Options options);

  // GPUs visible to this process; 0 when there is none or no usable driver.
  static int VisibleDeviceCount();

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;
  // Waits for the stream. Tensors still alive keep the stream until they are freed.
  ~CudaDevice() override;

  std::string name() const override;

  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) override;
  int64_t allocated_bytes() const override { return allocated_->load(); }
  // cudaMemGetInfo's total; 0 when it cannot be read.
  int64_t memory_capacity() const override;
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
  // The norm stays on the device: nothing waits for the host.
  absl::Status ScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                  Tensor& out) override;

  absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y) override;
  absl::Status Convert(const Tensor& src, Tensor& dst) override;

  UpdateKernels& updates() override { return updates_; }
  MatrixKernels& matrix() override { return matrix_; }

  absl::Status Synchronize() override;

 private:
  explicit CudaDevice(std::unique_ptr<internal::CudaContext> ctx);

  // Enqueues the conversion of `count` host elements of `src_dtype` to fp32 at device address
  // `dst` (CopyFromHost and AddFromHost; the caller validated, activated and synchronises).
  absl::Status EnqueueFromHost(const void* src, DType src_dtype, int64_t count, float* dst);

  // Ordinal, stream and library handles, shared with updates_ and matrix_ (declared first:
  // destroyed last).
  const std::unique_ptr<internal::CudaContext> ctx_;
  // Logical bytes (numel × dtype size) of the live tensors; shared with their deleters.
  const std::shared_ptr<std::atomic<int64_t>> allocated_;
  CudaUpdateKernels updates_;
  CudaMatrixKernels matrix_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_DEVICE_H_
