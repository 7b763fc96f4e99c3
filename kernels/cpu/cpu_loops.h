#ifndef OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_
#define OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_

// Loop helpers of the CPU device (kernels/cpu), shared by its source files: the static OpenMP
// partition, the tiled transpose and the element conversions between the host dtypes and fp32.
// Stateless.

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/dtype.h"

namespace optstep {
namespace internal {

// Elements per 64-byte cache line of fp32: parallel ranges start on a line boundary.
constexpr int64_t kLineFloats = 64 / sizeof(float);

// dst {cols, rows} ← srcᵀ of the row-major src {rows, cols}, in square tiles of 32 (a tile of
// either side stays in cache), rows of tiles split over `threads`.
template <typename T>
inline void TransposeTiles(const T* src, int64_t rows, int64_t cols, T* dst, int threads) {
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t rt = 0; rt < row_tiles; ++rt) {
    const int64_t r_end = std::min(rows, (rt + 1) * kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c_end = std::min(cols, c0 + kTile);
      for (int64_t r = rt * kTile; r < r_end; ++r) {
        for (int64_t c = c0; c < c_end; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

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

// dst ← src, `bytes` bytes, split over `threads`. REQUIRES: the ranges do not overlap.
inline void CopyBytes(const void* src, void* dst, int64_t bytes, int threads) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  ParallelFor(bytes, threads,
              [s, d](int64_t begin, int64_t end) { std::memcpy(d + begin, s + begin, end - begin); });
}

// One parallel region over several arrays (multi-tensor apply): calls fn(k, begin, end) on ranges
// [begin, end) of array k, whose sizes are `sizes`, so that the threads share the elements of all
// the arrays evenly. The arrays are laid end to end, each starting on a cache line, and the whole
// is split as ParallelFor splits one range; each thread then runs its part array by array. Every
// element is visited once, by one call.
template <typename Fn>
inline void ParallelSpans(absl::Span<const int64_t> sizes, int threads, const Fn& fn) {
  std::vector<int64_t> starts(sizes.size() + 1, 0);  // in the line-padded concatenation
  for (size_t k = 0; k < sizes.size(); ++k) {
    starts[k + 1] = starts[k] + (sizes[k] + kLineFloats - 1) / kLineFloats * kLineFloats;
  }
  ParallelBlocks(starts.back(), threads, kLineFloats, [&](int64_t begin, int64_t end) {
    size_t k = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    for (; k < sizes.size() && starts[k] < end; ++k) {
      const int64_t lo = std::max(begin, starts[k]) - starts[k];
      const int64_t hi = std::min(end - starts[k], sizes[k]);
      if (lo < hi) fn(k, lo, hi);
    }
  });
}

// Conversions between host element types and fp32, on ranges that the caller partitions, with the
// baseline variant's loops; CpuContext::loops has those of the device's variant.
inline void HostToF32(const void* src, DType src_dtype, int64_t n, float* dst) {
  BaselineElementwiseKernels().host_to_f32(src, src_dtype, n, dst);
}

inline void F32ToHost(const float* src, int64_t n, DType dst_dtype, void* dst) {
  BaselineElementwiseKernels().f32_to_host(src, n, dst_dtype, dst);
}

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_LOOPS_H_
