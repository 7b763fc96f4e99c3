#ifndef OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_
#define OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"

namespace optstep {
namespace internal {

// bf16 × bf16 → fp32 GEMMs through oneDNN's matmul primitive, which multiplies with the CPU's
// bf16 instructions (AVX512-BF16 dot products or AMX tiles) and accumulates in fp32: the products
// of bf16 values are exact in fp32, so the result is the fp32 sum of the exact products up to the
// order of the additions (and oneDNN's flushing of denormal inputs and partial sums to zero). The
// primitives are created once per shape, layout, α and β and kept (at most kMaxPrimitives; the
// cache is emptied when full). oneDNN runs on the calling thread's OpenMP runtime, with the
// thread count each call names.
//
// Thread safety: thread-compatible (the primitive cache is mutated by Run). Owned by a
// CpuMatrixKernels.
class DnnlGemm {
 public:
  static constexpr size_t kMaxPrimitives = 256;

  DnnlGemm();
  ~DnnlGemm();
  DnnlGemm(const DnnlGemm&) = delete;
  DnnlGemm& operator=(const DnnlGemm&) = delete;

  // Row-major C{m, n} (fp32, contiguous) ← α·op(A)·op(B) + β·C on `threads` OpenMP threads, where
  // op(A) {m, k} is A (bf16 {m, k}) or Aᵀ (A bf16 {k, m}), and op(B) {k, n} likewise. With β == 0,
  // C is not read. A and B may be the same matrix. INTERNAL when oneDNN refuses.
  // REQUIRES: m, n, k >= 1; threads >= 1.
  absl::Status Run(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, const uint16_t* b, float beta, float* c);

  // oneDNN's name of the implementation that ran the last product (e.g. "brg:avx512_core_bf16"),
  // "" before the first one.
  const std::string& last_implementation() const { return last_implementation_; }

 private:
  struct Primitive;
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, float, float>;

  struct Handles;
  std::unique_ptr<Handles> handles_;  // oneDNN engine and stream
  std::map<Key, std::unique_ptr<Primitive>> primitives_;
  std::string last_implementation_;
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_
