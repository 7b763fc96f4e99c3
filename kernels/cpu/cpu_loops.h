#ifndef OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_
#define OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_

// Loop helpers of the CPU device (kernels/cpu), shared by its source files: the static OpenMP
// partition and the element conversions between the host dtypes and fp32. Stateless.

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"
#include "kernels/math/half.h"

namespace optstep {
namespace internal {

// Elements per 64-byte cache line of fp32: parallel ranges start on a line boundary.
constexpr int64_t kLineFloats = 64 / sizeof(float);

// Calls fn(begin, end) on `threads` contiguous ranges of [0, n), in parallel, each starting on a
// multiple of `align`. Static partition: thread t always gets the same range.
template <typename Fn>
inline void ParallelBlocks(int64_t n, int threads, int64_t align, const Fn& fn) {
  if (threads <= 1 || n <= align) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t chunk = ((n + nt - 1) / nt + align - 1) / align * align;
    const int64_t begin = std::min(n, t * chunk);
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  }
}

// ParallelBlocks on cache lines of fp32 elements.
template <typename Fn>
inline void ParallelFor(int64_t n, int threads, const Fn& fn) {
  ParallelBlocks(n, threads, kLineFloats, fn);
}

// Conversions between host element types and fp32, on ranges that the caller partitions.
inline void HostToF32(const void* src, DType src_dtype, int64_t n, float* __restrict dst) {
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = math::Bf16ToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] = math::Fp16ToFloat(s[i]);
      return;
    }
  }
}

inline void F32ToHost(const float* __restrict src, int64_t n, DType dst_dtype, void* dst) {
  switch (dst_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* __restrict d = static_cast<uint16_t*>(dst);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) d[i] = math::FloatToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* __restrict d = static_cast<uint16_t*>(dst);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) d[i] = math::FloatToFp16(src[i]);
      return;
    }
  }
}

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_
