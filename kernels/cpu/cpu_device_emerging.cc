// CpuUpdateKernels: the element-wise updates of the emerging optimizers (formulas in
// kernels/math/emerging.h); CpuDevice: Axpby and Convert; CpuMatrixKernels: the data-movement
// primitives (Transpose, CopyRowBlocks, AxisDot, AxisScale, Permute). See cpu_device.h.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/status_macros.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/cpu/cpu_loops.h"
#include "kernels/emerging_validation.h"
#include "kernels/math/emerging.h"
#include "kernels/matrix_validation.h"

namespace optstep {
namespace {

using internal::ParallelFor;

}  // namespace

absl::Status CpuUpdateKernels::Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                                    Tensor& exp_avg) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckLion(args, grad, param, exp_avg));
  internal::SplitLoop(ctx_, grad.numel(), ctx_.loops->lion, args, grad.f32(), param.f32(),
                      exp_avg.f32());
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad,
                                            Tensor& param, Tensor& momentum, Tensor& update) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckMuonMomentum(args, grad, param, momentum, update));
  internal::SplitLoop(ctx_, grad.numel(), ctx_.loops->muon_momentum, args, grad.f32(), param.f32(),
                      momentum.f32(), update.f32());
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::Adamuon(const math::Moment2Args& args, const Tensor& update,
                                       Tensor& param, Tensor& moment) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAdamuon(args, update, param, moment));
  internal::SplitLoop(ctx_, update.numel(), ctx_.loops->adamuon, args, update.f32(), param.f32(),
                      moment.f32());
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::NormuonMoment(const math::Moment2Args& args,
                                             const Tensor& sum_squares, Tensor& moment,
                                             Tensor& scale) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckNormuonMoment(args, sum_squares, moment, scale));
  const float* s = sum_squares.f32();
  float* v = moment.f32();
  float* w = scale.f32();
  for (int64_t i = 0; i < moment.numel(); ++i) math::NormuonMomentElement(args, s[i], v[i], w[i]);
  return absl::OkStatus();
}

absl::Status CpuUpdateKernels::SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad,
                                        Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& direction) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSoapAdam(args, grad, exp_avg, exp_avg_sq, direction));
  internal::SplitLoop(ctx_, grad.numel(), ctx_.loops->soap_adam, args, grad.f32(), exp_avg.f32(),
                      exp_avg_sq.f32(), direction.f32());
  return absl::OkStatus();
}

absl::Status CpuDevice::Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxpby(alpha, x, beta, y));
  const int64_t n = y.numel();
  const float* xs = x.f32();
  float* ys = y.f32();
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  ParallelFor(n, ctx_.ThreadsFor(n), [&](int64_t begin, int64_t end) {
    loops.axpby(alpha, xs + begin, beta, ys + begin, end - begin);
  });
  return absl::OkStatus();
}

absl::Status CpuDevice::Convert(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckConvert(src, dst));
  const int64_t n = src.numel();
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.data());
  const size_t s_size = DTypeSize(src.dtype());
  const size_t d_size = DTypeSize(dst.dtype());
  const internal::CpuElementwiseKernels& loops = *ctx_.loops;
  ParallelFor(n, ctx_.ThreadsFor(n), [&](int64_t begin, int64_t end) {
    if (src.dtype() == DType::kF32) {
      loops.f32_to_host(reinterpret_cast<const float*>(s) + begin, end - begin, dst.dtype(),
                        d + begin * d_size);
    } else {
      loops.host_to_f32(s + begin * s_size, src.dtype(), end - begin,
                        reinterpret_cast<float*>(d) + begin);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::Transpose(const Tensor& src, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckTranspose(src, dst));
  internal::TransposeTiles(src.f32(), src.dim(0), src.dim(1), dst.f32(),
                           ctx_.ThreadsFor(src.numel()));
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src,
                                             Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckRowBlockCopy(copy, src, dst));
  const int64_t cols = src.dim(1);
  const size_t block_bytes = static_cast<size_t>(copy.block_rows * cols) * sizeof(float);
  if (block_bytes == 0) return absl::OkStatus();
  const float* s = src.f32();
  float* d = dst.f32();
  for (int64_t b = 0; b < copy.num_blocks; ++b) {
    std::memcpy(d + (copy.dst_first_row + b * copy.dst_block_stride) * cols,
                s + (copy.src_first_row + b * copy.src_block_stride) * cols, block_bytes);
  }
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::AxisDot(const Tensor& a, const Tensor& b, Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxisDot(a, b, out));
  const int64_t rows = a.dim(0);
  const int64_t cols = a.dim(1);
  const float* x = a.f32();
  const float* y = b.f32();
  float* o = out.f32();
  const int threads = ctx_.ThreadsFor(a.numel());
  if (internal::PerRow(out, a)) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        sum += static_cast<double>(x[r * cols + c]) * static_cast<double>(y[r * cols + c]);
      }
      o[r] = static_cast<float>(sum);
    }
    return absl::OkStatus();
  }
  // Per column: each thread owns a range of columns and walks the rows in order, so every sum
  // adds its terms in row order whatever the thread count.
  ParallelFor(cols, threads, [&](int64_t begin, int64_t end) {
    std::vector<double> sums(end - begin, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* yr = y + r * cols;
      for (int64_t c = begin; c < end; ++c) {
        sums[c - begin] += static_cast<double>(xr[c]) * static_cast<double>(yr[c]);
      }
    }
    for (int64_t c = begin; c < end; ++c) o[c] = static_cast<float>(sums[c - begin]);
  });
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::AxisScale(const Tensor& v, Tensor& x) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckAxisScale(v, x));
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  const bool per_row = internal::PerRow(v, x);
  const float* w = v.f32();
  float* d = x.f32();
  const int threads = ctx_.ThreadsFor(x.numel());
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict row = d + r * cols;
    if (per_row) {
      const float s = w[r];
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = row[c] * s;
    } else {
      const float* __restrict ws = w;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = row[c] * ws[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::Permute(const Tensor& src, int axis,
                                       const std::vector<int64_t>& perm, Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckPermute(src, axis, perm, dst));
  const int64_t rows = src.dim(0);
  const int64_t cols = src.dim(1);
  const float* s = src.f32();
  float* d = dst.f32();
  const int threads = ctx_.ThreadsFor(src.numel());
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    if (axis == 0) {
      std::memcpy(d + r * cols, s + perm[r] * cols, cols * sizeof(float));
    } else {
      for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = s[r * cols + perm[c]];
    }
  }
  return absl::OkStatus();
}

}  // namespace optstep
