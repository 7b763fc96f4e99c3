// CpuMatrixKernels: GEMM through OpenBLAS (and oneDNN for kMedium with CpuGemmBackend::kOneDnn),
// symmetric eigendecomposition and QR through LAPACKE. See cpu_device.h.

#include <cblas.h>
#include <lapacke.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_loops.h"
#include "kernels/math/half.h"
#include "kernels/matrix_validation.h"

namespace optstep {
namespace {

using internal::ParallelFor;

// dst[i] = bf16(src[i]) as an fp32 value: the inputs of a kMedium product.
void RoundToBf16(const float* src, int64_t n, float* dst, int threads) {
  ParallelFor(n, threads, [&](int64_t begin, int64_t end) {
    const float* __restrict s = src;
    float* __restrict d = dst;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) d[i] = math::Bf16ToFloat(math::FloatToBf16(s[i]));
  });
}

// dst[i] = bf16(src[i]), rounded to nearest even.
void NarrowToBf16(const float* src, int64_t n, uint16_t* dst, int threads) {
  ParallelFor(n, threads, [&](int64_t begin, int64_t end) {
    internal::F32ToHost(src + begin, end - begin, DType::kBF16, dst + begin);
  });
}

void WidenBf16(const Tensor& t, float* dst, int threads) {
  const uint16_t* s = static_cast<const uint16_t*>(t.data());
  ParallelFor(t.numel(), threads, [&](int64_t begin, int64_t end) {
    internal::HostToF32(s + begin, DType::kBF16, end - begin, dst + begin);
  });
}

// Products below this many floating-point operations run on the calling thread.
constexpr double kMinParallelFlops = 1 << 24;
// Rows (or columns) of C per thread are a multiple of this (OpenBLAS's register tiles).
constexpr int64_t kBlockAlign = 16;

// One single-threaded sgemm on a row-major block: C{m, n} (leading dimension ldc) ←
// α·op(A)·op(B) + β·C.
void SgemmBlock(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, lda)), b,
              static_cast<blasint>(std::max<int64_t>(1, ldb)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, ldc)));
}

// Row-major C{m, n} ← α·op(A)·op(B) + β·C with op(A) {m, k} on `threads` OpenMP threads: C is
// cut into contiguous blocks of rows (of columns when n > m), one single-threaded sgemm each.
// OpenBLAS runs single-threaded (CpuDevice::Create): its own pool and OpenMP's would otherwise
// spin against each other between calls (measured: Newton–Schulz 60% slower on 2 cores).
// Handles the empty cases that BLAS would refuse (a leading dimension of 0).
void Sgemm(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  if (threads <= 1 || 2.0 * m * n * k < kMinParallelFlops || extent < 2 * kBlockAlign) {
    SgemmBlock(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
    return;
  }
  internal::ParallelBlocks(extent, threads, kBlockAlign, [&](int64_t begin, int64_t end) {
    if (by_rows) {
      // Rows of op(A): rows of A, or columns of the stored Aᵀ.
      const float* a_rows = ta ? a + begin : a + begin * lda;
      SgemmBlock(ta, tb, end - begin, n, k, alpha, a_rows, lda, b, ldb, beta, c + begin * n, n);
    } else {
      // Columns of op(B): columns of B, or rows of the stored Bᵀ.
      const float* b_cols = tb ? b + begin * ldb : b + begin;
      SgemmBlock(ta, tb, m, end - begin, k, alpha, a, lda, b_cols, ldb, beta, c + begin, n);
    }
  });
}

// Symmetric products (SymmetricGemm) are computed in panels of rows on and above the diagonal,
// rows [r0, r1) of C against its columns [r0, m), then mirrored below it: (P + 1) / 2P of the
// full product's work for P panels. Panel i is paired with panel P − 1 − i (every pair is about
// the same work) and the pairs are dealt to the threads, each panel one single-threaded product:
// P = 2 × threads (at least 4), panels of at least kMinPanelRows rows. Measured on 768 × 768 and
// 768 × 3072 bf16 Newton–Schulz with oneDNN on 2 threads, this beat both the full product and 8
// panels that each ran on both threads (whose small products parallelize poorly).
constexpr int64_t kMinPanelRows = 16;

// One panel of a symmetric C {m, m} = op(A)·op(B): its rows [r0, r1) (columns [r0, m)), and where
// its operands start in the stored A and B: row r0 of op(A) (column r0 of a stored Aᵀ) and column
// r0 of op(B) (row r0 of a stored Bᵀ).
struct Panel {
  int64_t r0, r1;
  int64_t a_offset, b_offset;
};

std::vector<Panel> UpperPanels(const GemmArgs& args, const Tensor& a, const Tensor& b, int64_t m,
                               int threads) {
  const int64_t count = std::clamp<int64_t>(m / kMinPanelRows, 1, std::max(4, 2 * threads));
  const int64_t step = (m + count - 1) / count;
  std::vector<Panel> panels;
  for (int64_t r0 = 0; r0 < m; r0 += step) {
    panels.push_back({r0, std::min(m, r0 + step), args.transpose_a ? r0 : r0 * a.dim(1),
                      args.transpose_b ? r0 * b.dim(1) : r0});
  }
  return panels;
}

// Calls fn(i) for every i in [0, n) on `threads` OpenMP threads, i on thread owner(i, team size).
// Returns the first error of the lowest thread.
template <typename Owner, typename Fn>
absl::Status RunOwned(int64_t n, int threads, const Owner& owner, const Fn& fn) {
  std::vector<absl::Status> status(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    for (int64_t i = 0; i < n && status[t].ok(); ++i) {
      if (owner(i, nt) == t) status[t] = fn(i);
    }
  }
  for (const absl::Status& s : status) OPTSTEP_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// RunOwned for panels: panel i and n − 1 − i go to the same thread, pairs round-robin.
template <typename Fn>
absl::Status RunPanelPairs(int64_t n, int threads, const Fn& fn) {
  return RunOwned(
      n, threads, [n](int64_t i, int nt) { return static_cast<int>(std::min(i, n - 1 - i) % nt); },
      fn);
}

// c[j][i] ← c[i][j] for i in [r0, r1) and j in (i, m): the rows [r0, r1) of the upper triangle of
// the row-major {m, m} c mirrored into its columns [r0, r1) below the diagonal. A panel's thread
// mirrors its own rows as soon as they are computed, inside the panels' parallel region: those
// entries below the diagonal are read and written by no other panel (each reads and writes only
// its rows on and above the diagonal), so no barrier and no second region (under
// OMP_WAIT_POLICY=passive, one more sleep and wake-up of every thread) is needed. The columns
// [r0, r1) of a row j are contiguous and the rows [r0, r1) of a column stay in L1 while j moves
// along them.
template <typename T>
void MirrorPanel(T* c, int64_t m, int64_t r0, int64_t r1) {
  for (int64_t j = r0 + 1; j < m; ++j) {
    const int64_t i1 = std::min(r1, j);
    for (int64_t i = r0; i < i1; ++i) c[j * m + i] = c[i * m + j];
  }
}

// c[j][i] ← c[i][j] for every i < j: the upper triangle of the row-major {m, m} c mirrored below
// the diagonal, in tiles (after a full product).
template <typename T>
void MirrorUpper(T* c, int64_t m, int threads) {
  constexpr int64_t kTile = 64;
  const int64_t tiles = (m + kTile - 1) / kTile;
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (int64_t jt = 0; jt < tiles; ++jt) {
    const int64_t j0 = jt * kTile;
    const int64_t j1 = std::min(m, j0 + kTile);
    for (int64_t i0 = 0; i0 <= j0; i0 += kTile) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t i1 = std::min(j, i0 + kTile);
        for (int64_t i = i0; i < i1; ++i) c[j * m + i] = c[i * m + j];
      }
    }
  }
}

// OpenBLAS on `threads` threads for the scope of a LAPACK call (its blocked algorithms get their
// parallelism from BLAS), back to one thread after.
class BlasThreads {
 public:
  explicit BlasThreads(int threads) { openblas_set_num_threads(threads); }
  ~BlasThreads() { openblas_set_num_threads(1); }
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;
};

// Whether every off-diagonal entry of the {n, n} matrix is zero.
bool IsDiagonal(const float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (i != j && a[i * n + j] != 0.0f) return false;
    }
  }
  return true;
}

}  // namespace

void CpuDevice::SetBlasThreads(int num_threads) { openblas_set_num_threads(num_threads); }

absl::Status CpuDevice::GemmFrom(const GemmArgs& args, bool symmetric, const Tensor& a,
                                 const Tensor& b, const Tensor& d, Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckGemmFrom(args, symmetric, a, b, d, c));
  return symmetric ? matrix_.SymmetricGemmFrom(args, a, b, d, c)
                   : matrix_.GemmFrom(args, a, b, d, c);
}

CpuMatrixKernels::CpuMatrixKernels(internal::CpuContext ctx, CpuGemmBackend backend,
                                   size_t dnnl_max_primitives)
    : ctx_(ctx), backend_(backend) {
  if (backend == CpuGemmBackend::kOneDnn) {
    dnnl_ = std::make_unique<internal::DnnlGemm>(dnnl_max_primitives);
  }
}

std::vector<float>& CpuMatrixKernels::GemmScratch(int slot, int64_t n) {
  std::vector<float>& buffer = gemm_scratch_[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer;
}

char* CpuMatrixKernels::BlockScratch(int64_t bytes) {
  if (static_cast<int64_t>(block_scratch_.size()) < bytes) block_scratch_.resize(bytes);
  return block_scratch_.data();
}

std::vector<uint16_t>& CpuMatrixKernels::Bf16Scratch(int slot, int64_t n) {
  std::vector<uint16_t>& buffer = bf16_scratch_[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer;
}

const uint16_t* CpuMatrixKernels::Bf16Operand(const Tensor& t, int slot) {
  if (t.dtype() == DType::kBF16) return static_cast<const uint16_t*>(t.data());
  // fp32 inputs rounded to bf16 (to nearest even), as the OpenBLAS path rounds them.
  uint16_t* rounded = Bf16Scratch(slot, t.numel()).data();
  NarrowToBf16(t.f32(), t.numel(), rounded, ctx_.ThreadsFor(t.numel()));
  return rounded;
}

std::pair<const float*, const float*> CpuMatrixKernels::Fp32Operands(const GemmArgs& args,
                                                                     const Tensor& a,
                                                                     const Tensor& b) {
  if (args.precision != MatmulPrecision::kMedium) return {a.f32(), b.f32()};
  float* ra = GemmScratch(0, a.numel()).data();
  RoundToBf16(a.f32(), a.numel(), ra, ctx_.ThreadsFor(a.numel()));
  if (b.data() == a.data()) return {ra, ra};
  float* rb = GemmScratch(1, b.numel()).data();
  RoundToBf16(b.f32(), b.numel(), rb, ctx_.ThreadsFor(b.numel()));
  return {ra, rb};
}

absl::Status CpuMatrixKernels::OneDnnGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                          Tensor& c) {
  internal::DnnlProduct p;
  p.ta = args.transpose_a;
  p.tb = args.transpose_b;
  p.m = c.dim(0);
  p.n = c.dim(1);
  p.k = args.transpose_a ? a.dim(0) : a.dim(1);
  p.lda = a.dim(1);
  p.ldb = b.dim(1);
  p.ldc = p.n;
  p.alpha = args.alpha;
  p.beta = args.beta;
  // bf16 tensors: fp32 products and epilogue, rounded to bf16 once, by oneDNN.
  p.c_bf16 = c.dtype() == DType::kBF16;
  const uint16_t* pa = Bf16Operand(a, 0);
  const uint16_t* pb = b.data() == a.data() ? pa : Bf16Operand(b, 1);
  OPTSTEP_RETURN_IF_ERROR(dnnl_->Run(ctx_.num_threads, p, pa, pb, c.data()));
  last_gemm_library_ = absl::StrCat("onednn:", dnnl_->last_implementation());
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                    Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckGemm(args, a, b, c));
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = args.transpose_a ? a.dim(0) : a.dim(1);
  const int64_t lda = a.dim(1);
  const int64_t ldb = b.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  if (dnnl_ != nullptr && args.precision == MatmulPrecision::kMedium && k > 0) {
    return OneDnnGemm(args, a, b, c);
  }
  last_gemm_library_ = "openblas";
  if (a.dtype() == DType::kBF16) {
    // bf16 in and out: exact widening, fp32 products and epilogue, one rounding to bf16.
    float* wa = GemmScratch(0, a.numel()).data();
    float* wb = wa;
    float* wc = GemmScratch(2, c.numel()).data();
    WidenBf16(a, wa, ctx_.ThreadsFor(a.numel()));
    if (b.data() != a.data()) {
      wb = GemmScratch(1, b.numel()).data();
      WidenBf16(b, wb, ctx_.ThreadsFor(b.numel()));
    }
    if (args.beta != 0.0f) WidenBf16(c, wc, ctx_.ThreadsFor(c.numel()));
    Sgemm(ctx_.num_threads, args.transpose_a, args.transpose_b, m, n, k, args.alpha, wa, lda, wb,
          ldb, args.beta, wc);
    NarrowToBf16(wc, c.numel(), static_cast<uint16_t*>(c.data()), ctx_.ThreadsFor(c.numel()));
    return absl::OkStatus();
  }
  const auto [pa, pb] = Fp32Operands(args, a, b);
  Sgemm(ctx_.num_threads, args.transpose_a, args.transpose_b, m, n, k, args.alpha, pa, lda, pb, ldb,
        args.beta, c.f32());
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::OneDnnGemmRowsFrom(const GemmArgs& args, const Tensor& a,
                                                  const Tensor& b, const Tensor& d, Tensor& c) {
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = a.dim(1);
  const bool c_bf16 = c.dtype() == DType::kBF16;
  const int64_t row_bytes = n * static_cast<int64_t>(c_bf16 ? sizeof(uint16_t) : sizeof(float));
  const uint16_t* pa = Bf16Operand(a, 0);
  const uint16_t* pb = b.data() == a.data() ? pa : Bf16Operand(b, 1);
  // One block of rows per thread, each a dense product (oneDNN's brg kernels); every row of C
  // sums its k products in the order oneDNN's own split over the threads sums them
  // (cpu_gemm_test compares the two bit for bit).
  const int threads = ctx_.num_threads;
  const int64_t rows = ((m + threads - 1) / threads + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  std::vector<internal::DnnlProduct> products;
  for (int64_t r0 = 0; r0 < m; r0 += rows) {
    products.push_back({false, args.transpose_b, std::min(rows, m - r0), n, k, k, b.dim(1), n,
                        args.alpha, args.beta, c_bf16});
  }
  OPTSTEP_ASSIGN_OR_RETURN(const auto prepared, dnnl_->PrepareSingleThreaded(products));
  const char* source = static_cast<const char*>(d.data());
  char* target = static_cast<char*>(c.data());
  OPTSTEP_RETURN_IF_ERROR(RunOwned(
      static_cast<int64_t>(products.size()), threads,
      [](int64_t i, int nt) { return static_cast<int>(i % nt); },
      [&](int64_t i) {
        const int64_t r0 = i * rows;
        std::memcpy(target + r0 * row_bytes, source + r0 * row_bytes, products[i].m * row_bytes);
        return internal::DnnlGemm::RunOnThisThread(*prepared[i], pa + r0 * k, pb,
                                                   target + r0 * row_bytes);
      }));
  last_gemm_library_ = absl::StrCat("onednn:", dnnl_->last_implementation());
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::GemmFrom(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                        const Tensor& d, Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckGemm(args, a, b, c));
  if (args.beta == 0.0f || d.data() == c.data()) return Gemm(args, a, b, c);
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = args.transpose_a ? a.dim(0) : a.dim(1);
  if (dnnl_ != nullptr && args.precision == MatmulPrecision::kMedium && !args.transpose_a &&
      ctx_.num_threads > 1 && m >= 2 * kBlockAlign && n > 0 && k > 0 &&
      2.0 * m * n * k >= kMinParallelFlops) {
    return OneDnnGemmRowsFrom(args, a, b, d, c);
  }
  internal::CopyBytes(d.data(), c.data(), static_cast<int64_t>(c.bytes()), ctx_.ThreadsFor(c.numel()));
  return Gemm(args, a, b, c);
}

absl::Status CpuMatrixKernels::SymmetricGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                             Tensor& c) {
  return Symmetric(args, a, b, nullptr, c);
}

absl::Status CpuMatrixKernels::SymmetricGemmFrom(const GemmArgs& args, const Tensor& a,
                                                 const Tensor& b, const Tensor& d, Tensor& c) {
  const bool reads_d = args.beta != 0.0f && d.data() != c.data();
  return Symmetric(args, a, b, reads_d ? &d : nullptr, c);
}

absl::Status CpuMatrixKernels::Symmetric(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                         const Tensor* d, Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckGemm(args, a, b, c));
  const int64_t m = c.dim(0);
  const int64_t k = args.transpose_a ? a.dim(0) : a.dim(1);
  if (m != c.dim(1)) return MatrixKernels::SymmetricGemm(args, a, b, c);  // the error
  if (m == 0) return absl::OkStatus();
  const bool bf16 = c.dtype() == DType::kBF16;
  if (k == 0 || (bf16 && dnnl_ == nullptr)) {
    // Nothing to multiply, or bf16 emulated on OpenBLAS (widened whole): the full product.
    if (d != nullptr) {
      internal::CopyBytes(d->data(), c.data(), static_cast<int64_t>(c.bytes()),
                          ctx_.ThreadsFor(c.numel()));
    }
    OPTSTEP_RETURN_IF_ERROR(Gemm(args, a, b, c));
    const int threads = ctx_.ThreadsFor(m * m);
    if (bf16) {
      MirrorUpper(static_cast<uint16_t*>(c.data()), m, threads);
    } else {
      MirrorUpper(c.f32(), m, threads);
    }
    return absl::OkStatus();
  }
  const int threads = 2.0 * m * m * k < kMinParallelFlops ? 1 : ctx_.num_threads;
  const std::vector<Panel> panels = UpperPanels(args, a, b, m, threads);
  const int64_t n = static_cast<int64_t>(panels.size());
  if (dnnl_ != nullptr && args.precision == MatmulPrecision::kMedium) {
    // oneDNN 2.x's brgemm kernels take dense blocks only (else it falls back to gemm:jit, 2 to 3
    // times slower): every panel runs as dense op(A) rows {rows, k} times the dense rows
    // {m − r0, k} of op(B)ᵀ (tb), into a dense block copied into C. Transposed operands are
    // transposed once (O(m·k) against the product's O(m²·k)); A·A of one symmetric A takes A's
    // rows for its columns.
    const uint16_t* pa = Bf16Operand(a, 0);
    const uint16_t* pb = b.data() == a.data() ? pa : Bf16Operand(b, 1);
    const uint16_t* rows_a = pa;  // op(A) {m, k}
    if (args.transpose_a) {
      uint16_t* transposed = Bf16Scratch(2, m * k).data();
      internal::TransposeTiles(pa, k, m, transposed, ctx_.ThreadsFor(m * k));
      rows_a = transposed;
    }
    const uint16_t* rows_b = pb;  // op(B)ᵀ {m, k}
    if (!args.transpose_b && b.data() == a.data()) {
      rows_b = rows_a;  // Aᵀ·A: op(B)ᵀ = op(A); A·A: Aᵀ = A
    } else if (!args.transpose_b) {
      uint16_t* transposed = Bf16Scratch(3, m * k).data();
      internal::TransposeTiles(pb, k, m, transposed, ctx_.ThreadsFor(m * k));
      rows_b = transposed;
    }
    const size_t c_bytes = bf16 ? sizeof(uint16_t) : sizeof(float);
    std::vector<internal::DnnlProduct> products;
    std::vector<int64_t> block_offset;  // of each panel's dense block in BlockScratch
    int64_t block_bytes = 0;
    for (const Panel& panel : panels) {
      const int64_t cols = m - panel.r0;
      products.push_back(
          {false, true, panel.r1 - panel.r0, cols, k, k, k, cols, args.alpha, args.beta, bf16});
      block_offset.push_back(block_bytes);
      block_bytes += (panel.r1 - panel.r0) * cols * static_cast<int64_t>(c_bytes);
    }
    char* blocks = BlockScratch(block_bytes);
    // Every panel's primitive before the region: the cache may be emptied only here.
    OPTSTEP_ASSIGN_OR_RETURN(const auto prepared, dnnl_->PrepareSingleThreaded(products));
    OPTSTEP_RETURN_IF_ERROR(RunPanelPairs(n, threads, [&](int64_t i) {
      const Panel& panel = panels[i];
      const int64_t rows = panel.r1 - panel.r0;
      const size_t row_bytes = (m - panel.r0) * c_bytes;
      char* block = blocks + block_offset[i];
      const size_t offset = (panel.r0 * m + panel.r0) * c_bytes;
      char* target = static_cast<char*>(c.data()) + offset;
      if (args.beta != 0.0f) {  // the β term: the panel's rows of C, or of D
        const char* source = d == nullptr ? target : static_cast<const char*>(d->data()) + offset;
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(block + r * row_bytes, source + r * m * c_bytes, row_bytes);
        }
      }
      OPTSTEP_RETURN_IF_ERROR(internal::DnnlGemm::RunOnThisThread(
          *prepared[i], rows_a + panel.r0 * k, rows_b + panel.r0 * k, block));
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(target + r * m * c_bytes, block + r * row_bytes, row_bytes);
      }
      if (bf16) {
        MirrorPanel(static_cast<uint16_t*>(c.data()), m, panel.r0, panel.r1);
      } else {
        MirrorPanel(c.f32(), m, panel.r0, panel.r1);
      }
      return absl::OkStatus();
    }));
    last_gemm_library_ = absl::StrCat("onednn:", dnnl_->last_implementation());
  } else {
    const std::pair<const float*, const float*> operands = Fp32Operands(args, a, b);
    const float* pa = operands.first;
    const float* pb = operands.second;
    OPTSTEP_RETURN_IF_ERROR(RunPanelPairs(n, threads, [&](int64_t i) {
      const Panel& panel = panels[i];
      if (d != nullptr) {  // the β term: the panel's rows of D, on and above the diagonal
        for (int64_t r = panel.r0; r < panel.r1; ++r) {
          std::memcpy(c.f32() + r * m + panel.r0, d->f32() + r * m + panel.r0,
                      (m - panel.r0) * sizeof(float));
        }
      }
      SgemmBlock(args.transpose_a, args.transpose_b, panel.r1 - panel.r0, m - panel.r0, k,
                 args.alpha, pa + panel.a_offset, a.dim(1), pb + panel.b_offset, b.dim(1),
                 args.beta, c.f32() + panel.r0 * m + panel.r0, m);
      MirrorPanel(c.f32(), m, panel.r0, panel.r1);
      return absl::OkStatus();
    }));
    last_gemm_library_ = "openblas";
  }
  return absl::OkStatus();  // every panel mirrored its own rows
}

absl::Status CpuMatrixKernels::SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                                             Tensor& eigenvectors) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckSymmetricEigh(a, shift, eigenvalues, eigenvectors));
  const int64_t n = a.dim(0);
  const float* x = a.f32();
  float* values = eigenvalues.f32();
  float* vectors = eigenvectors.f32();
  if (n == 0) return absl::OkStatus();
  if (IsDiagonal(x, n)) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t i, int64_t j) { return x[i * n + i] > x[j * n + j]; });
    std::fill(vectors, vectors + n * n, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      vectors[order[j] * n + j] = 1.0f;
      values[j] = x[order[j] * n + order[j]];
    }
    return absl::OkStatus();
  }
  // LAPACK answers ascending eigenvalues; columns are reversed below.
  std::vector<float> work(x, x + n * n);
  for (int64_t i = 0; i < n; ++i) work[i * n + i] += shift;
  std::vector<float> w(n);
  const lapack_int ni = static_cast<lapack_int>(n);
  BlasThreads blas(ctx_.num_threads);
  lapack_int info = LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'U', ni, work.data(), ni, w.data());
  if (info != 0) {
    // Retry the same shifted matrix in fp64.
    std::vector<double> dwork(work.begin(), work.end());
    std::vector<double> dw(n);
    info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', ni, dwork.data(), ni, dw.data());
    if (info != 0) {
      return absl::InternalError(absl::StrCat("SymmetricEigh: ssyevd and dsyevd failed on a ", n,
                                              "x", n, " matrix (info ", info, ")"));
    }
    std::copy(dwork.begin(), dwork.end(), work.begin());
    std::copy(dw.begin(), dw.end(), w.begin());
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t src = n - 1 - j;
    values[j] = w[src] - shift;
    for (int64_t i = 0; i < n; ++i) vectors[i * n + j] = work[i * n + src];
  }
  return absl::OkStatus();
}

absl::Status CpuMatrixKernels::Qr(const Tensor& a, Tensor& q) {
  OPTSTEP_RETURN_IF_ERROR(internal::CheckQr(a, q));
  const int64_t m = a.dim(0);
  const int64_t n = a.dim(1);
  if (m == 0 || n == 0) return absl::OkStatus();
  float* out = q.f32();
  std::copy(a.f32(), a.f32() + m * n, out);
  std::vector<float> tau(n);
  const lapack_int mi = static_cast<lapack_int>(m);
  const lapack_int ni = static_cast<lapack_int>(n);
  BlasThreads blas(ctx_.num_threads);
  lapack_int info = LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, mi, ni, out, ni, tau.data());
  if (info == 0) info = LAPACKE_sorgqr(LAPACK_ROW_MAJOR, mi, ni, ni, out, ni, tau.data());
  if (info != 0) {
    return absl::InternalError(
        absl::StrCat("Qr: sgeqrf/sorgqr failed on a ", m, "x", n, " matrix (info ", info, ")"));
  }
  return absl::OkStatus();
}

}  // namespace optstep
