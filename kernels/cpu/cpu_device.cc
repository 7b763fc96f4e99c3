#include "kernels/cpu/cpu_device.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/cpu/cpu_gemm_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_loops.h"
#include "kernels/device_validation.h"

namespace optstep {
namespace {

using internal::ParallelFor;

// Host buffers that are not aligned to their element size are converted through an aligned
// bounce buffer of this many elements (the vectorised loops may assume natural alignment).
constexpr int64_t kBounceElements = 4096;

bool NaturallyAligned(const void* p, DType dtype) {
  return reinterpret_cast<uintptr_t>(p) % DTypeSize(dtype) == 0;
}

// loops.host_to_f32 for any host address: misaligned sources go through an aligned bounce buffer.
void HostToF32AnyAlignment(const internal::CpuElementwiseKernels& loops, const void* src,
                           DType src_dtype, int64_t n, float* dst) {
  if (src_dtype == DType::kF32 || NaturallyAligned(src, src_dtype)) {
    loops.host_to_f32(src, src_dtype, n, dst);
    return;
  }
  alignas(CpuDevice::kAlignment) uint16_t bounce[kBounceElements];
  const char* s = static_cast<const char*>(src);
  for (int64_t i = 0; i < n; i += kBounceElements) {
    int64_t m = std::min(kBounceElements, n - i);
    std::memcpy(bounce, s + i * sizeof(uint16_t), m * sizeof(uint16_t));
    loops.host_to_f32(bounce, src_dtype, m, dst + i);
  }
}

void F32ToHostAnyAlignment(const internal::CpuElementwiseKernels& loops, const float* src,
                           int64_t n, DType dst_dtype, void* dst) {
  if (dst_dtype == DType::kF32 || NaturallyAligned(dst, dst_dtype)) {
    loops.f32_to_host(src, n, dst_dtype, dst);
    return;
  }
  alignas(CpuDevice::kAlignment) uint16_t bounce[kBounceElements];
  char* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; i += kBounceElements) {
    int64_t m = std::min(kBounceElements, n - i);
    loops.f32_to_host(src + i, m, dst_dtype, bounce);
    std::memcpy(d + i * sizeof(uint16_t), bounce, m * sizeof(uint16_t));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(Options options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CpuDevice: num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CpuDevice: memory_limit_bytes must be >= 0, got ", options.memory_limit_bytes));
  }
  const CpuIsa detected = DetectCpuIsa();
  OPTSTEP_ASSIGN_OR_RETURN(
      const CpuIsa isa,
      ResolveCpuIsa(options.isa.empty() ? std::getenv(kCpuIsaEnv) : options.isa.c_str(), detected));
  int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  SetBlasThreads(1);  // the device's OpenMP threads drive OpenBLAS (cpu_device_linalg.cc)
  internal::CpuContext ctx;
  ctx.num_threads = std::max(1, threads);
  ctx.isa = isa;
  ctx.loops = &internal::ElementwiseKernels(isa);
  LOG(INFO) << "CPU device: " << ctx.num_threads << " threads, element-wise kernels "
            << CpuIsaName(isa) << " (this CPU supports up to " << CpuIsaName(detected) << ")";
  OPTSTEP_ASSIGN_OR_RETURN(
      const CpuGemmBackend gemm,
      ResolveCpuGemmBackend(options.gemm.empty() ? std::getenv(kCpuGemmEnv) : options.gemm.c_str(),
                            OneDnnHasBf16Isa()));
  LOG(INFO) << "CPU device: GEMM backend " << CpuGemmBackendName(gemm) << " ("
            << (gemm == CpuGemmBackend::kOneDnn ? "bf16 products on oneDNN, fp32 on OpenBLAS"
                                                : "every product on OpenBLAS")
            << "; oneDNN bf16 instructions " << (OneDnnHasBf16Isa() ? "found" : "not found") << ")";
  return std::unique_ptr<CpuDevice>(new CpuDevice(ctx, options.memory_limit_bytes, gemm));
}

absl::StatusOr<Tensor> CpuDevice::Allocate(DType dtype, const Shape& shape) {
  OPTSTEP_ASSIGN_OR_RETURN(int64_t bytes, internal::AllocationBytes("Allocate", dtype, shape));
  // Round up to whole cache lines (at least one, so that an empty tensor is still defined).
  if (bytes > INT64_MAX - kAlignment) {
    return absl::ResourceExhaustedError(absl::StrCat("Allocate: ", bytes, " bytes"));
  }
  const int64_t padded =
      std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  const int64_t held = allocated_->fetch_add(bytes) + bytes;
  if (memory_limit_bytes_ > 0 && held > memory_limit_bytes_) {
    allocated_->fetch_sub(bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "Allocate: ", ShapeString(shape), " ", DTypeName(dtype), " needs ", bytes,
        " bytes; the device holds ", held - bytes, " of its limit ", memory_limit_bytes_));
  }
  void* data = std::aligned_alloc(kAlignment, static_cast<size_t>(padded));
  if (data == nullptr) {
    allocated_->fetch_sub(bytes);
    return absl::ResourceExhaustedError(absl::StrCat("Allocate: out of host memory for ",
                                                     ShapeString(shape), " ", DTypeName(dtype),
                                                     " (", bytes, " bytes)"));
  }
  // Zero with the threads that will later work on each range (first touch).
  char* base = static_cast<char*>(data);
  ParallelFor(padded / sizeof(float), ctx_.ThreadsFor(padded / sizeof(float)),
              [base](int64_t begin, int64_t end) {
                std::memset(base + begin * sizeof(float), 0, (end - begin) * sizeof(float));
              });
  std::shared_ptr<std::atomic<int64_t>> counter = allocated_;
  return Tensor(dtype, shape, data, [counter, bytes](void* p) {
    std::free(p);
    counter->fetch_sub(bytes);
  });
}

absl::Status CpuDevice::Zero(Tensor& tensor) {
  if (!tensor.defined()) return absl::InvalidArgumentError("Zero: tensor is not allocated");
  char* base = static_cast<char*>(tensor.data());
  const int64_t bytes = static_cast<int64_t>(tensor.bytes());
  ParallelFor(bytes, ctx_.ThreadsFor(bytes / sizeof(float)),
              [base](int64_t begin, int64_t end) { std::memset(base + begin, 0, end - begin); });
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                     int64_t dst_offset) {
  return FromHost("CopyFromHost", /*add=*/false, src, src_dtype, count, dst, dst_offset);
}

absl::Status CpuDevice::AddFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                    int64_t dst_offset) {
  return FromHost("AddFromHost", /*add=*/true, src, src_dtype, count, dst, dst_offset);
}

absl::Status CpuDevice::FromHost(const char* op, bool add, const void* src, DType src_dtype,
                                 int64_t count, Tensor& dst, int64_t dst_offset) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckHostTransfer(op, dst, dst_offset, count, src_dtype, src));
  const char* s = static_cast<const char*>(src);
  float* d = dst.f32() + dst_offset;
  const size_t esize = DTypeSize(src_dtype);
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  ParallelFor(count, ctx_.ThreadsFor(count), [&](int64_t begin, int64_t end) {
    if (!add) {
      return HostToF32AnyAlignment(loops, s + begin * esize, src_dtype, end - begin, d + begin);
    }
    alignas(kAlignment) float converted[kBounceElements];
    for (int64_t i = begin; i < end; i += kBounceElements) {
      const int64_t m = std::min(kBounceElements, end - i);
      HostToF32AnyAlignment(loops, s + i * esize, src_dtype, m, converted);
      loops.add(converted, d + i, m);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyToHost(const Tensor& src, int64_t offset, int64_t count,
                                   DType dst_dtype, void* dst) {
  OPTSTEP_RETURN_IF_ERROR(
      internal::CheckHostTransfer("CopyToHost", src, offset, count, dst_dtype, dst));
  const float* s = src.f32() + offset;
  char* d = static_cast<char*>(dst);
  const size_t esize = DTypeSize(dst_dtype);
  ParallelFor(count, ctx_.ThreadsFor(count), [&](int64_t begin, int64_t end) {
    F32ToHostAnyAlignment(*ctx_.loops, s + begin, end - begin, dst_dtype, d + begin * esize);
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::Copy(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckCopy(src, dst));
  if (src.data() == dst.data()) return absl::OkStatus();
  const int64_t bytes = static_cast<int64_t>(src.bytes());
  internal::CopyBytes(src.data(), dst.data(), bytes, ctx_.ThreadsFor(bytes / sizeof(float)));
  return absl::OkStatus();
}

absl::Status CpuDevice::Add(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Add", "src", src));
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Add", "dst", dst));
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSameSize("Add", "dst", dst, "src", src));
  const float* s = src.f32();
  float* d = dst.f32();
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  ParallelFor(dst.numel(), ctx_.ThreadsFor(dst.numel()),
              [&](int64_t begin, int64_t end) { loops.add(s + begin, d + begin, end - begin); });
  return absl::OkStatus();
}

absl::Status CpuDevice::Scale(float scale, Tensor& x) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("Scale", "x", x));
  internal::SplitLoop(ctx_, x.numel(), ctx_.loops->scale, scale, x.f32());
  return absl::OkStatus();
}

absl::StatusOr<GradientStats> CpuDevice::ComputeGradientStats(const Tensor& grad) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckF32("ComputeGradientStats", "grad", grad));
  const int64_t n = grad.numel();
  const int64_t num_blocks = (n + kStatsBlockElements - 1) / kStatsBlockElements;
  std::vector<double> block_sums(num_blocks);
  const float* x = grad.f32();
  const int threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_blocks, ctx_.ThreadsFor(n))));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kStatsBlockElements;
    block_sums[b] = ctx_.loops->sum_squares(x + begin, std::min(kStatsBlockElements, n - begin));
  }
  GradientStats stats;
  for (double s : block_sums) stats.sum_squares += s;
  // Finite fp32 squares cannot overflow a float64 sum of fewer than ~1e231 terms, so the sum is
  // finite exactly when every element is: Inf² = Inf, NaN² = NaN, and both propagate.
  stats.all_finite = std::isfinite(stats.sum_squares);
  return stats;
}

absl::Status CpuUpdateKernels::AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                                     Tensor& exp_avg, Tensor& exp_avg_sq) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAdamW(args, grad, param, exp_avg, exp_avg_sq));
  internal::SplitLoop(ctx_, grad.numel(), ctx_.loops->adamw, args, grad.f32(), param.f32(),
                      exp_avg.f32(), exp_avg_sq.f32());
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::AdamWBatch(const math::AdamWArgs& args,
                                          absl::Span<const AdamWOperands> batch) {
  std::vector<int64_t> sizes;
  sizes.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const AdamWOperands& t = batch[i];
    if (t.grad == nullptr || t.param == nullptr || t.exp_avg == nullptr ||
        t.exp_avg_sq == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("AdamWBatch: parameter ", i, " of ", batch.size(), " has a null tensor"));
    }
    absl::Status valid = internal::CheckAdamW(args, *t.grad, *t.param, *t.exp_avg, *t.exp_avg_sq);
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("AdamWBatch: parameter ", i, " of ",
                                                     batch.size(), ": ", valid.message()));
    }
    sizes.push_back(t.grad->numel());
  }
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  internal::ParallelSpans(sizes, ctx_.ThreadsFor(total), [&](size_t k, int64_t begin, int64_t end) {
    const AdamWOperands& t = batch[k];
    loops.adamw(args, t.grad->f32() + begin, t.param->f32() + begin, t.exp_avg->f32() + begin,
                t.exp_avg_sq->f32() + begin, end - begin);
  });
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                                   Tensor* momentum_buffer) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSgd(args, grad, param, momentum_buffer));
  const int64_t n = grad.numel();
  const float* g = grad.f32();
  float* p = param.f32();
  float* b = args.momentum == 0.0f ? nullptr : momentum_buffer->f32();
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  ParallelFor(n, ctx_.ThreadsFor(n), [&](int64_t begin, int64_t end) {
    loops.sgd(args, g + begin, p + begin, b == nullptr ? nullptr : b + begin, end - begin);
  });
  return absl::OkStatus();
}

}  // namespace optstep
