#include "tests/server/optim/reference/matrix64.h"

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

namespace optstep {
namespace ref {

Matrix Matrix::FromFloats(int64_t r, int64_t c, const std::vector<float>& values) {
  Matrix m(r, c);
  for (int64_t i = 0; i < r * c; ++i) m.v[i] = values[i];
  return m;
}

std::vector<float> Matrix::ToFloats() const {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}

Matrix MatMul(const Matrix& a, const Matrix& b) {
  Matrix c(a.rows, b.cols);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t k = 0; k < a.cols; ++k) {
      const double x = a(i, k);
      if (x == 0.0) continue;
      for (int64_t j = 0; j < b.cols; ++j) c(i, j) += x * b(k, j);
    }
  }
  return c;
}

Matrix Transpose(const Matrix& a) {
  Matrix t(a.cols, a.rows);
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < a.cols; ++j) t(j, i) = a(i, j);
  }
  return t;
}

Matrix Identity(int64_t n) {
  Matrix e(n, n);
  for (int64_t i = 0; i < n; ++i) e(i, i) = 1.0;
  return e;
}

Matrix Combine(double alpha, const Matrix& a, double beta, const Matrix& b) {
  Matrix c(a.rows, a.cols);
  for (size_t i = 0; i < c.v.size(); ++i) c.v[i] = alpha * a.v[i] + beta * b.v[i];
  return c;
}

double FrobeniusNorm(const Matrix& a) {
  double s = 0.0;
  for (double x : a.v) s += x * x;
  return std::sqrt(s);
}

double MaxAbs(const Matrix& a) {
  double m = 0.0;
  for (double x : a.v) m = std::max(m, std::fabs(x));
  return m;
}

double MaxAbsDiff(const Matrix& a, const Matrix& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.v.size(); ++i) m = std::max(m, std::fabs(a.v[i] - b.v[i]));
  return m;
}

void WeightDecay(char mode, double lr, double lambda, Matrix& p, Matrix& g) {
  if (lambda == 0.0) return;
  for (size_t i = 0; i < p.v.size(); ++i) {
    switch (mode) {
      case 'd':
        p.v[i] -= lr * lambda * p.v[i];
        break;
      case 'i':
        p.v[i] -= lambda * p.v[i];
        break;
      case 'l':
        g.v[i] += lambda * p.v[i];
        break;
      case 'p':
        p.v[i] -= lambda * lr * lr * p.v[i];
        break;
      default:
        std::abort();
    }
  }
}

double SpectralNorm(const Matrix& a) { return ThinSvd(a).s.front(); }

Eigen SymmetricEigen(const Matrix& a) {
  const lapack_int n = static_cast<lapack_int>(a.rows);
  std::vector<double> work = a.v;
  std::vector<double> w(n);
  if (LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', n, work.data(), n, w.data()) != 0) std::abort();
  Eigen e{std::vector<double>(n), Matrix(n, n)};
  for (lapack_int j = 0; j < n; ++j) {
    e.values[j] = w[n - 1 - j];
    for (lapack_int i = 0; i < n; ++i) e.vectors(i, j) = work[i * n + (n - 1 - j)];
  }
  return e;
}

Matrix QrQ(const Matrix& a) {
  Matrix q = a;
  const lapack_int m = static_cast<lapack_int>(a.rows);
  const lapack_int n = static_cast<lapack_int>(a.cols);
  std::vector<double> tau(n);
  if (LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, m, n, q.v.data(), n, tau.data()) != 0) std::abort();
  if (LAPACKE_dorgqr(LAPACK_ROW_MAJOR, m, n, n, q.v.data(), n, tau.data()) != 0) std::abort();
  return q;
}

Svd ThinSvd(const Matrix& a) {
  const lapack_int m = static_cast<lapack_int>(a.rows);
  const lapack_int n = static_cast<lapack_int>(a.cols);
  const lapack_int k = std::min(m, n);
  std::vector<double> work = a.v;
  Svd svd{Matrix(m, k), std::vector<double>(k), Matrix(k, n)};
  std::vector<double> superb(std::max<lapack_int>(1, k));
  if (LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', m, n, work.data(), n, svd.s.data(), svd.u.v.data(),
                     k, svd.vt.v.data(), n, superb.data()) != 0) {
    std::abort();
  }
  return svd;
}

Matrix PolarFactor(const Matrix& a) {
  const Svd svd = ThinSvd(a);
  return MatMul(svd.u, svd.vt);
}

}  // namespace ref
}  // namespace optstep
