#ifndef OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MATRIX64_H_
#define OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MATRIX64_H_

// Float64 dense matrices for the reference implementations of the optimizer tests: plain loops,
// and LAPACK in double precision (dsyevd, dgeqrf/dorgqr, dgesvd) where a decomposition is
// needed. Written from the spec, independent of kernels/ and server/optim. Test-only.

#include <cstdint>
#include <vector>

namespace optstep {
namespace ref {

// Row-major rows×cols.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> v;

  Matrix() = default;
  Matrix(int64_t r, int64_t c, double fill = 0.0) : rows(r), cols(c), v(r * c, fill) {}
  double& operator()(int64_t i, int64_t j) { return v[i * cols + j]; }
  double operator()(int64_t i, int64_t j) const { return v[i * cols + j]; }

  static Matrix FromFloats(int64_t r, int64_t c, const std::vector<float>& values);
  std::vector<float> ToFloats() const;
};

Matrix MatMul(const Matrix& a, const Matrix& b);
Matrix Transpose(const Matrix& a);
Matrix Identity(int64_t n);
// alpha·a + beta·b.
Matrix Combine(double alpha, const Matrix& a, double beta, const Matrix& b);
double FrobeniusNorm(const Matrix& a);
double MaxAbs(const Matrix& a);
// max |a − b|.
double MaxAbsDiff(const Matrix& a, const Matrix& b);
// ‖a‖₂ (largest singular value).
double SpectralNorm(const Matrix& a);

// Weight decay of spec §2 in place: 'd' decoupled p ← p − η·λ·p, 'i' independent p ← p − λ·p,
// 'l' l2 g ← g + λ·p, 'p' palm p ← p − λ·η²·p. Nothing when λ == 0.
void WeightDecay(char mode, double lr, double lambda, Matrix& p, Matrix& g);

// Eigenvectors (columns) of a symmetric matrix, sorted by descending eigenvalue.
struct Eigen {
  std::vector<double> values;
  Matrix vectors;
};
Eigen SymmetricEigen(const Matrix& a);

// Q of a Householder QR (rows >= cols; thin).
Matrix QrQ(const Matrix& a);

// Thin SVD a = U·diag(s)·Vᵀ, s descending.
struct Svd {
  Matrix u;
  std::vector<double> s;
  Matrix vt;
};
Svd ThinSvd(const Matrix& a);
// U·Vᵀ of the thin SVD.
Matrix PolarFactor(const Matrix& a);

}  // namespace ref
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MATRIX64_H_
