// CpuMatrixKernels: GEMM through OpenBLAS (and oneDNN for kMedium with CpuGemmBackend::kOneDnn),
// symmetric eigendecomposition and QR through LAPACKE. See cpu_device.h.

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
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

CpuMatrixKernels::CpuMatrixKernels(internal::CpuContext ctx, CpuGemmBackend backend)
    : ctx_(ctx), backend_(backend) {
  if (backend == CpuGemmBackend::kOneDnn) dnnl_ = std::make_unique<internal::DnnlGemm>();
}

std::vector<float>& CpuMatrixKernels::GemmScratch(int slot, int64_t n) {
  std::vector<float>& buffer = gemm_scratch_[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer;
}

std::vector<uint16_t>& CpuMatrixKernels::Bf16Scratch(int slot, int64_t n) {
  std::vector<uint16_t>& buffer = bf16_scratch_[slot];
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer;
}

absl::Status CpuMatrixKernels::OneDnnGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                                          Tensor& c) {
  const int64_t m = c.dim(0);
  const int64_t n = c.dim(1);
  const int64_t k = args.transpose_a ? a.dim(0) : a.dim(1);
  const bool bf16 = a.dtype() == DType::kBF16;
  const uint16_t* pa = static_cast<const uint16_t*>(a.data());
  const uint16_t* pb = static_cast<const uint16_t*>(b.data());
  if (!bf16) {
    // fp32 inputs rounded to bf16 (to nearest even), as the OpenBLAS path rounds them.
    uint16_t* ra = Bf16Scratch(0, a.numel()).data();
    NarrowToBf16(a.f32(), a.numel(), ra, ctx_.ThreadsFor(a.numel()));
    pb = pa = ra;
    if (b.data() != a.data()) {
      uint16_t* rb = Bf16Scratch(1, b.numel()).data();
      NarrowToBf16(b.f32(), b.numel(), rb, ctx_.ThreadsFor(b.numel()));
      pb = rb;
    }
    OPTSTEP_RETURN_IF_ERROR(dnnl_->Run(ctx_.num_threads, args.transpose_a, args.transpose_b, m, n,
                                       k, args.alpha, pa, pb, args.beta, c.f32()));
  } else {
    // bf16 in and out: fp32 result and epilogue, one rounding to bf16.
    float* wc = GemmScratch(2, c.numel()).data();
    if (args.beta != 0.0f) WidenBf16(c, wc, ctx_.ThreadsFor(c.numel()));
    OPTSTEP_RETURN_IF_ERROR(dnnl_->Run(ctx_.num_threads, args.transpose_a, args.transpose_b, m, n,
                                       k, args.alpha, pa, pb, args.beta, wc));
    NarrowToBf16(wc, c.numel(), static_cast<uint16_t*>(c.data()), ctx_.ThreadsFor(c.numel()));
  }
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
  const float* pa = a.f32();
  const float* pb = b.f32();
  if (args.precision == MatmulPrecision::kMedium) {
    float* ra = GemmScratch(0, a.numel()).data();
    RoundToBf16(pa, a.numel(), ra, ctx_.ThreadsFor(a.numel()));
    pa = ra;
    if (b.data() == a.data()) {
      pb = ra;
    } else {
      float* rb = GemmScratch(1, b.numel()).data();
      RoundToBf16(pb, b.numel(), rb, ctx_.ThreadsFor(b.numel()));
      pb = rb;
    }
  }
  Sgemm(ctx_.num_threads, args.transpose_a, args.transpose_b, m, n, k, args.alpha, pa, lda, pb, ldb,
        args.beta, c.f32());
  return absl::OkStatus();
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
