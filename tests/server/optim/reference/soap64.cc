#include "tests/server/optim/reference/soap64.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace optstep {
namespace ref {
namespace {

// diag(Qᵀ·K·Q).
std::vector<double> RayleighDiagonal(const Matrix& k, const Matrix& q) {
  const Matrix d = MatMul(Transpose(q), MatMul(k, q));
  std::vector<double> out(d.rows);
  for (int64_t i = 0; i < d.rows; ++i) out[i] = d(i, i);
  return out;
}

// Q·diag(1/(n·max(λ, ε)))·Qᵀ.
Matrix KlPreconditioner(const Matrix& k, const Matrix& q, double eps) {
  const std::vector<double> lambda = RayleighDiagonal(k, q);
  const int64_t n = k.rows;
  Matrix scaled = q;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      scaled(i, j) /= static_cast<double>(n) *
                      std::max(lambda[j], static_cast<double>(static_cast<float>(eps)));
    }
  }
  return MatMul(scaled, Transpose(q));
}

std::vector<int64_t> DescendingOrder(const std::vector<double>& values) {
  std::vector<int64_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return values[a] > values[b]; });
  return order;
}

bool IsDiagonal(const Matrix& k) {
  for (int64_t i = 0; i < k.rows; ++i) {
    for (int64_t j = 0; j < k.cols; ++j) {
      if (i != j && k(i, j) != 0.0) return false;
    }
  }
  return true;
}

// Eigenvectors of K (descending), with the reference's diagonal short-cut and shift.
Matrix EighBasis(const Matrix& k) {
  const int64_t n = k.rows;
  if (IsDiagonal(k)) {
    std::vector<double> diag(n);
    for (int64_t i = 0; i < n; ++i) diag[i] = k(i, i);
    const std::vector<int64_t> order = DescendingOrder(diag);
    Matrix q(n, n);
    for (int64_t j = 0; j < n; ++j) q(order[j], j) = 1.0;
    return q;
  }
  Matrix shifted = k;
  for (int64_t i = 0; i < n; ++i) shifted(i, i) += 1e-7;
  return SymmetricEigen(shifted).vectors;
}

}  // namespace

Soap64::Soap64(const SoapSpec& spec, int64_t m, int64_t n)
    : spec_(spec),
      left_(m, m),
      right_(n, n),
      q_left_(Identity(m)),
      q_right_(Identity(n)),
      m_(m, n),
      v_(m, n) {}

void Soap64::UpdateFactors(const Matrix& g, double beta) {
  const Matrix gt = Transpose(g);
  Matrix add_left, add_right;
  if (spec_.kl) {
    const Matrix c_left = KlPreconditioner(left_, q_left_, spec_.eps);
    const Matrix c_right = KlPreconditioner(right_, q_right_, spec_.eps);
    add_left = MatMul(MatMul(g, c_right), gt);
    add_right = MatMul(MatMul(gt, c_left), g);
  } else {
    add_left = MatMul(g, gt);
    add_right = MatMul(gt, g);
  }
  left_ = Combine(beta, left_, 1.0 - beta, add_left);
  right_ = Combine(beta, right_, 1.0 - beta, add_right);
}

void Soap64::Refresh(bool eigh) {
  m_ = MatMul(MatMul(q_left_, m_), Transpose(q_right_));
  if (eigh) {
    q_left_ = EighBasis(left_);
    q_right_ = EighBasis(right_);
  } else {
    for (int side = 0; side < 2; ++side) {
      const Matrix& k = side == 0 ? left_ : right_;
      Matrix& q = side == 0 ? q_left_ : q_right_;
      const std::vector<int64_t> order = DescendingOrder(RayleighDiagonal(k, q));
      Matrix permuted_v = v_;
      Matrix permuted_q = q;
      for (int64_t i = 0; i < v_.rows; ++i) {
        for (int64_t j = 0; j < v_.cols; ++j) {
          permuted_v(i, j) = side == 0 ? v_(order[i], j) : v_(i, order[j]);
        }
      }
      for (int64_t i = 0; i < q.rows; ++i) {
        for (int64_t j = 0; j < q.cols; ++j) permuted_q(i, j) = q(i, order[j]);
      }
      v_ = permuted_v;
      q = permuted_q;
      for (int64_t it = 0; it < spec_.power_iter_steps; ++it) q = QrQ(MatMul(k, q));
    }
  }
  m_ = MatMul(MatMul(Transpose(q_left_), m_), q_right_);
}

Matrix Soap64::Step(const Matrix& grad, double lr, double lambda, Matrix& p) {
  const int64_t s = step_;
  const double t = static_cast<double>(s + 1);
  double beta = spec_.shampoo_beta;
  if (spec_.correct_shampoo_beta_bias) beta = 1.0 - (1.0 - beta) / (1.0 - std::pow(beta, t));
  UpdateFactors(grad, beta);
  const bool projected = s >= spec_.warmup;
  if (projected && s % spec_.frequency == 0) {
    bool refresh = true;
    if (spec_.adaptive && s > spec_.warmup) {
      refresh = false;
      for (int side = 0; side < 2; ++side) {
        const Matrix& k = side == 0 ? left_ : right_;
        const std::vector<double> d = RayleighDiagonal(k, side == 0 ? q_left_ : q_right_);
        double dn = 0.0;
        for (double x : d) dn += x * x;
        const double kn = FrobeniusNorm(k);
        if (spec_.tolerance * kn < kn - std::sqrt(dn)) refresh = true;
      }
    }
    if (refresh) Refresh(spec_.use_eigh || s == spec_.warmup);
  }
  Matrix g = grad;
  WeightDecay(spec_.decay_mode, lr, lambda, p, g);
  if (projected) g = MatMul(MatMul(Transpose(q_left_), g), q_right_);
  const double b1 = spec_.beta1, b2 = spec_.beta2;
  const double bc1 = spec_.correct_bias ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = spec_.correct_bias ? 1.0 - std::pow(b2, t) : 1.0;
  Matrix d(g.rows, g.cols);
  for (size_t i = 0; i < g.v.size(); ++i) {
    m_.v[i] = b1 * m_.v[i] + (1.0 - b1) * g.v[i];
    v_.v[i] = b2 * v_.v[i] + (1.0 - b2) * g.v[i] * g.v[i];
    double n = m_.v[i] / bc1;
    if (spec_.nesterov) {
      n = spec_.correct_bias
              ? b1 * m_.v[i] / (1.0 - std::pow(b1, t + 1.0)) + (1.0 - b1) * g.v[i] / bc1
              : b1 * m_.v[i] + (1.0 - b1) * g.v[i];
    }
    d.v[i] = n / (std::sqrt(v_.v[i] / bc2) + spec_.eps);
  }
  Matrix u = projected ? MatMul(MatMul(q_left_, d), Transpose(q_right_)) : d;
  if (spec_.max_update_rms > 0.0) {
    const double rms = FrobeniusNorm(u) / std::sqrt(static_cast<double>(u.v.size()));
    const double factor = std::min(1.0, spec_.max_update_rms / (rms + 1e-7));
    for (double& x : u.v) x *= factor;
  }
  for (size_t i = 0; i < p.v.size(); ++i) p.v[i] -= lr * u.v[i];
  step_ = s + 1;
  return u;
}

}  // namespace ref
}  // namespace optstep
