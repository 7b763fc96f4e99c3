#ifndef OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_
#define OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace optstep {
namespace internal {

// One product of DnnlGemm::Run, on row-major operands that may be blocks of larger matrices:
// C{m, n} (leading dimension ldc) ← α·op(A)·op(B) + β·C, where op(A) {m, k} is A stored {m, k}
// with leading dimension lda or, with ta, Aᵀ of an A stored {k, m} (leading dimension lda); op(B)
// {k, n} likewise with tb and ldb. C is fp32, or bf16 (c_bf16): then β·C is read from bf16 and the
// fp32 result is rounded to bf16 (to nearest even) once.
struct DnnlProduct {
  bool ta = false;
  bool tb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  bool c_bf16 = false;
};

// bf16 × bf16 → fp32 (or bf16) GEMMs through oneDNN's matmul primitive, which multiplies with the
// CPU's bf16 instructions (AVX512-BF16 dot products or AMX tiles) and accumulates in fp32: the
// products of bf16 values are exact in fp32, so the result is the fp32 sum of the exact products
// up to the order of the additions (and oneDNN's flushing of denormal inputs and partial sums to
// zero). A primitive is created once per DnnlProduct and kept: at most max_primitives of them,
// the cache emptied when a call needs more. The cache holds them by shared_ptr, so emptying it
// never frees a primitive that a caller still holds. oneDNN runs on the calling thread's OpenMP
// runtime, with the thread count each call names, or (PrepareSingleThreaded, RunOnThisThread) one
// product per thread of a region the caller opens.
//
// Thread safety: thread-compatible (the primitive cache is mutated by Run and
// PrepareSingleThreaded); RunOnThisThread is thread-safe. Owned by a CpuMatrixKernels.
class DnnlGemm {
 public:
  // The default cache size: room for Newton–Schulz's panels (2 × threads per symmetric product,
  // at most m / 16) of X·Xᵀ for a few widths and of A·A for each step's α and β, so that the steps
  // after the first create none. By count, the 124M GPT layout's Muon step on 32 threads needs
  // about 350: 48 panels of X·Xᵀ for 2 widths and of A·A for 5 steps' coefficients, and the full
  // B·X products.
  static constexpr size_t kMaxPrimitives = 1024;

  // A primitive of one product (opaque outside dnnl_gemm.cc).
  struct Primitive;

  explicit DnnlGemm(size_t max_primitives = kMaxPrimitives);
  ~DnnlGemm();
  DnnlGemm(const DnnlGemm&) = delete;
  DnnlGemm& operator=(const DnnlGemm&) = delete;

  // The product `p` on `threads` OpenMP threads: a and b are bf16, c is fp32 or bf16 as p says.
  // With β == 0, C is not read. A and B may overlap. INTERNAL when oneDNN refuses.
  // REQUIRES: m, n, k >= 1; the leading dimensions fit the operands; threads >= 1.
  absl::Status Run(int threads, const DnnlProduct& p, const uint16_t* a, const uint16_t* b,
                   void* c);

  // The primitives of `products`, in order, each planned for one thread, for RunOnThisThread:
  // created where missing and kept as Run's are (the cache is emptied at most once, before the
  // first is created, and may then hold more than max_primitives until the next call that needs
  // room). The caller's references stay valid whatever the cache does later. INTERNAL when
  // oneDNN refuses. REQUIRES: each as Run.
  absl::StatusOr<std::vector<std::shared_ptr<const Primitive>>> PrepareSingleThreaded(
      const std::vector<DnnlProduct>& products);

  // Runs a prepared product on the calling thread alone; thread-safe (each thread uses its own
  // stream and scratchpad), so that threads of one OpenMP region run different products side by
  // side. INTERNAL when oneDNN fails.
  static absl::Status RunOnThisThread(const Primitive& primitive, const uint16_t* a,
                                      const uint16_t* b, void* c);

  // oneDNN's name of the implementation that ran the last product (e.g. "brg:avx512_core_bf16"),
  // or, after PrepareSingleThreaded, the distinct names of its primitives joined by ", "; "" before
  // the first one.
  const std::string& last_implementation() const { return last_implementation_; }

  // Primitives created since construction (each a oneDNN primitive_desc and JIT kernels), and
  // those in the cache now.
  int64_t primitives_created() const { return primitives_created_; }
  size_t cached_primitives() const { return primitives_.size(); }

 private:
  // The product and whether its primitive is planned for one thread.
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                         float, bool, bool>;

  static Key KeyOf(const DnnlProduct& p, bool single_threaded);
  // Empties the cache if `missing` more primitives would not fit.
  void MakeRoom(size_t missing);
  // The cached primitive of `p`, created if missing (without making room). Throws dnnl::error.
  std::shared_ptr<const Primitive> Find(const DnnlProduct& p, bool single_threaded);

  struct Handles;
  std::unique_ptr<Handles> handles_;  // oneDNN engine and stream
  const size_t max_primitives_;
  std::map<Key, std::shared_ptr<const Primitive>> primitives_;
  int64_t primitives_created_ = 0;
  std::string last_implementation_;
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_DNNL_GEMM_H_
