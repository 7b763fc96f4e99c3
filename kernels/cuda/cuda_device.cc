#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_libraries.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/device_validation.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(Options options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", options.ordinal, ": no usable CUDA device (cudaGetDeviceCount: ",
                     cudaGetErrorName(error), ": ", cudaGetErrorString(error), ")"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", options.ordinal, ": no CUDA device is visible"));
  }
  if (options.ordinal < 0 || options.ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", options.ordinal, ": only ", count, " CUDA device(s) are visible"));
  }
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.ordinal));
  int sms = 0;
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.ordinal));
  int threads_per_sm = 0;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, options.ordinal));
  // The stream-ordered scratch (internal::StreamScratch) comes from the device's default pool,
  // which by default hands freed memory back at every synchronization, so that the next
  // cudaMallocAsync maps it again and holds the host before it can queue anything. The pool keeps
  // up to kScratchPoolBytes instead: small scratch is reused, large scratch still goes back.
  cudaMemPool_t pool = nullptr;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, options.ordinal));
  uint64_t keep = kScratchPoolBytes;
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaStream_t stream = nullptr;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int max_blocks = std::max(1, sms * std::max(1, threads_per_sm / gpu::kThreadsPerBlock));
  auto owned_stream = std::make_shared<internal::CudaStream>(options.ordinal, stream);
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<internal::MathLibraries> libs,
                           internal::MathLibraries::Create(stream));
  auto ctx = std::make_unique<internal::CudaContext>();
  ctx->ordinal = options.ordinal;
  ctx->max_blocks = max_blocks;
  ctx->stream = std::move(owned_stream);
  ctx->libs = std::move(libs);
  return std::unique_ptr<CudaDevice>(new CudaDevice(std::move(ctx)));
}

int CudaDevice::VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

CudaDevice::CudaDevice(std::unique_ptr<internal::CudaContext> ctx)
    : ctx_(std::move(ctx)),
      allocated_(std::make_shared<std::atomic<int64_t>>(0)),
      updates_(ctx_.get()),
      matrix_(ctx_.get()) {}

CudaDevice::~CudaDevice() {
  if (ctx_->Activate().ok()) cudaStreamSynchronize(ctx_->stream->get());
}

std::string CudaDevice::name() const { return absl::StrCat("cuda:", ctx_->ordinal); }

absl::Status internal::CudaContext::Activate() const {
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return absl::OkStatus();
}

int64_t CudaDevice::memory_capacity() const {
  size_t free = 0;
  size_t total = 0;
  if (!ctx_->Activate().ok() || cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(total);
}

absl::StatusOr<Tensor> CudaDevice::Allocate(DType dtype, const Shape& shape) {
  OPTSTEP_ASSIGN_OR_RETURN(int64_t bytes, internal::AllocationBytes("Allocate", dtype, shape));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  // At least 256 bytes, so that an empty tensor is still defined (cudaMalloc aligns to 256).
  const size_t padded = static_cast<size_t>(std::max<int64_t>(bytes, 256));
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, padded);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    return absl::ResourceExhaustedError(absl::StrCat(
        "Allocate: out of memory on cuda:", ctx_->ordinal, " for ", ShapeString(shape), " ",
        DTypeName(dtype), " (", bytes, " bytes; the device holds ", allocated_bytes(), ")"));
  }
  if (error != cudaSuccess)
    return internal::CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__);
  allocated_->fetch_add(bytes);
  std::shared_ptr<internal::CudaStream> stream = ctx_->stream;
  std::shared_ptr<std::atomic<int64_t>> counter = allocated_;
  const int ordinal = ctx_->ordinal;
  Tensor tensor(dtype, shape, data, [stream, counter, bytes, ordinal](void* p) {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(ordinal);
    cudaStreamSynchronize(stream->get());  // no enqueued work may still use p
    cudaFree(p);
    if (previous >= 0 && previous != ordinal) cudaSetDevice(previous);
    counter->fetch_sub(bytes);
  });
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, padded, ctx_->stream->get()));
  return tensor;
}

absl::Status CudaDevice::Zero(Tensor& tensor) {
  if (!tensor.defined()) return absl::InvalidArgumentError("Zero: tensor is not allocated");
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(tensor.data(), 0, tensor.bytes(), ctx_->stream->get()));
  return absl::OkStatus();
}

absl::Status CudaDevice::EnqueueFromHost(const void* src, DType src_dtype, int64_t count,
                                         float* dst) {
  cudaStream_t stream = ctx_->stream->get();
  if (src_dtype == DType::kF32) {
    OPTSTEP_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }
  internal::StreamScratch staging(stream);  // freed in stream order, after the conversion
  OPTSTEP_RETURN_IF_ERROR(staging.Allocate(count * sizeof(uint16_t)));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      staging.as<uint16_t>(), src, count * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));
  const gpu::Launch launch = ctx_->launch();
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      src_dtype == DType::kBF16 ? gpu::LaunchBf16ToF32(staging.as<uint16_t>(), dst, count, launch)
                                : gpu::LaunchF16ToF32(staging.as<uint16_t>(), dst, count, launch));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                      int64_t dst_offset) {
  OPTSTEP_RETURN_IF_ERROR(
      internal::CheckHostTransfer("CopyFromHost", dst, dst_offset, count, src_dtype, src));
  if (count == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_RETURN_IF_ERROR(EnqueueFromHost(src, src_dtype, count, dst.f32() + dst_offset));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->stream->get()));
  return absl::OkStatus();
}

absl::Status CudaDevice::AddFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                     int64_t dst_offset) {
  OPTSTEP_RETURN_IF_ERROR(
      internal::CheckHostTransfer("AddFromHost", dst, dst_offset, count, src_dtype, src));
  if (count == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  // Converted into stream-ordered scratch of the chunk's size, then added with the Add kernel.
  internal::StreamScratch converted(ctx_->stream->get());
  OPTSTEP_RETURN_IF_ERROR(converted.Allocate(count * sizeof(float)));
  OPTSTEP_RETURN_IF_ERROR(EnqueueFromHost(src, src_dtype, count, converted.as<float>()));
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchAdd(converted.as<float>(), dst.f32() + dst_offset, count, ctx_->launch()));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->stream->get()));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyToHost(const Tensor& src, int64_t offset, int64_t count,
                                    DType dst_dtype, void* dst) {
  OPTSTEP_RETURN_IF_ERROR(
      internal::CheckHostTransfer("CopyToHost", src, offset, count, dst_dtype, dst));
  if (count == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  const float* s = src.f32() + offset;
  if (dst_dtype == DType::kF32) {
    OPTSTEP_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, s, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  } else {
    internal::StreamScratch staging(stream);
    OPTSTEP_RETURN_IF_ERROR(staging.Allocate(count * sizeof(uint16_t)));
    const gpu::Launch launch = ctx_->launch();
    OPTSTEP_CUDA_RETURN_IF_ERROR(
        dst_dtype == DType::kBF16 ? gpu::LaunchF32ToBf16(s, staging.as<uint16_t>(), count, launch)
                                  : gpu::LaunchF32ToF16(s, staging.as<uint16_t>(), count, launch));
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, staging.as<uint16_t>(), count * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
  }
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaDevice::Copy(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckCopy(src, dst));
  if (src.data() == dst.data() || src.bytes() == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(),
                                               cudaMemcpyDeviceToDevice, ctx_->stream->get()));
  return absl::OkStatus();
}

absl::Status CudaDevice::Add(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Add", "src", src));
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Add", "dst", dst));
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSameSize("Add", "dst", dst, "src", src));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAdd(src.f32(), dst.f32(), dst.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaDevice::Scale(float scale, Tensor& x) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Scale", "x", x));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchScale(scale, x.f32(), x.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::StatusOr<GradientStats> CudaDevice::ComputeGradientStats(const Tensor& grad) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("ComputeGradientStats", "grad", grad));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  const int64_t slots = gpu::SumSquaresScratchSize(grad.numel());
  internal::StreamScratch scratch(stream);
  OPTSTEP_RETURN_IF_ERROR(scratch.Allocate((slots + 1) * sizeof(double)));
  double* result = scratch.as<double>() + slots;
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchSumSquares(grad.f32(), grad.numel(), scratch.as<double>(),
                                                     result, ctx_->launch()));
  GradientStats stats;
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&stats.sum_squares, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // As on the CPU: a float64 sum of finite fp32 squares cannot overflow, so the sum is finite
  // exactly when every element is.
  stats.all_finite = std::isfinite(stats.sum_squares);
  return stats;
}

absl::Status CudaDevice::ScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                            Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckScaleByInverseNorm(norm_of, eps, x, out));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  cudaStream_t stream = ctx_->stream->get();
  const int64_t slots = gpu::SumSquaresScratchSize(norm_of.numel());
  internal::StreamScratch scratch(stream);  // freed in stream order, after the scale reads it
  OPTSTEP_RETURN_IF_ERROR(scratch.Allocate((slots + 1) * sizeof(double)));
  double* sum_squares = scratch.as<double>() + slots;
  const gpu::Launch launch = ctx_->launch();
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchSumSquares(norm_of.f32(), norm_of.numel(),
                                                     scratch.as<double>(), sum_squares, launch));
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchScaleByInverseNorm(sum_squares, eps, x.f32(), out.f32(), x.numel(), launch));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::AdamW(const math::AdamWArgs& args, const Tensor& grad,
                                      Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAdamW(args, grad, param, exp_avg, exp_avg_sq));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(gpu::LaunchAdamW(args, grad.f32(), param.f32(), exp_avg.f32(),
                                                exp_avg_sq.f32(), grad.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaUpdateKernels::Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                                    Tensor* momentum_buffer) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSgd(args, grad, param, momentum_buffer));
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  float* buffer = args.momentum != 0.0f ? momentum_buffer->f32() : nullptr;
  OPTSTEP_CUDA_RETURN_IF_ERROR(
      gpu::LaunchSgd(args, grad.f32(), param.f32(), buffer, grad.numel(), ctx_->launch()));
  return absl::OkStatus();
}

absl::Status CudaDevice::Synchronize() {
  OPTSTEP_RETURN_IF_ERROR(ctx_->Activate());
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx_->stream->get()));
  return absl::OkStatus();
}

}  // namespace optstep
