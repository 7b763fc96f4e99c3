#include "tests/server/optim/reference/muon64.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace optstep {
namespace ref {
namespace {

std::vector<Coefficients> Fp32(std::vector<Coefficients> rows) {
  for (Coefficients& r : rows) {
    r = {static_cast<float>(r.a), static_cast<float>(r.b), static_cast<float>(r.c)};
  }
  return rows;
}

const Coefficients& Row(const std::vector<Coefficients>& table, bool repeat_last, int k) {
  const int n = static_cast<int>(table.size());
  return table[repeat_last ? std::min(k, n - 1) : k % n];
}

}  // namespace

std::vector<Coefficients> SpecTable(const std::string& name) {
  if (name == "simple") return Fp32({{3.4445, -4.7750, 2.0315}});
  if (name == "quintic") {
    return Fp32({{4.0848, -6.8946, 2.9270},
                 {3.9505, -6.3029, 2.6377},
                 {3.7418, -5.5913, 2.3037},
                 {2.8769, -3.1427, 1.2046},
                 {2.8366, -3.0525, 1.2012}});
  }
  if (name == "polar_express") {
    return Fp32({{8.2051, -22.9019, 16.4607},
                 {4.0664, -2.8612, 0.5184},
                 {3.9096, -2.8234, 0.5250},
                 {3.2856, -2.4153, 0.4853},
                 {2.2779, -1.6198, 0.3985},
                 {1.8726, -1.2307, 0.3585},
                 {1.8564, -1.2132, 0.3568},
                 {1.8750, -1.2500, 0.3750}});
  }
  if (name == "aol") {
    return Fp32({{4.0098, -7.0585, 2.4635},
                 {3.4585, -5.5479, 2.5959},
                 {2.7573, -3.2939, 1.4254},
                 {2.7215, -3.0494, 1.3169}});
  }
  std::abort();
}

Matrix NewtonSchulz(const Matrix& x, const std::vector<Coefficients>& table, bool repeat_last,
                    int steps, double eps) {
  const bool transpose = x.rows > x.cols;
  Matrix X = transpose ? Transpose(x) : x;
  const double scale = 1.0 / std::max(FrobeniusNorm(X), eps);
  for (double& e : X.v) e *= scale;
  for (int k = 0; k < steps; ++k) {
    const Coefficients& co = Row(table, repeat_last, k);
    const Matrix A = MatMul(X, Transpose(X));
    const Matrix B = Combine(co.b, A, co.c, MatMul(A, A));
    X = Combine(co.a, X, 1.0, MatMul(B, X));
  }
  return transpose ? Transpose(X) : X;
}

double ComposedPolynomial(double sigma, const std::vector<Coefficients>& table, bool repeat_last,
                          int steps) {
  for (int k = 0; k < steps; ++k) {
    const Coefficients& co = Row(table, repeat_last, k);
    sigma = co.a * sigma + co.b * sigma * sigma * sigma + co.c * std::pow(sigma, 5);
  }
  return sigma;
}

double ScaleFactor(const std::string& mode, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (mode == "spectral") return std::sqrt(std::max(r, c));
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, r / c));
  if (mode == "unit_rms_norm") return std::sqrt(r / c);
  std::abort();
}

Matrix Muon64::OrthogonalizeOne(const Matrix& u) const {
  Matrix o = NewtonSchulz(u, spec_.table, spec_.repeat_last, spec_.steps);
  const double s = ScaleFactor(spec_.scale_mode, u.rows, u.cols) * spec_.kappa;
  for (double& e : o.v) e *= s;
  return o;
}

Matrix Muon64::Orthogonalized(const Matrix& grad, double lr, double lambda, Matrix& p) {
  Matrix g = grad;
  WeightDecay(spec_.decay_mode, lr, lambda, p, g);
  const double mu = spec_.momentum;
  Matrix u(g.rows, g.cols);
  for (size_t i = 0; i < g.v.size(); ++i) {
    momentum_.v[i] = mu * momentum_.v[i] + (1.0 - mu) * g.v[i];
    u.v[i] = spec_.nesterov ? (1.0 - mu) * g.v[i] + mu * momentum_.v[i] : momentum_.v[i];
  }
  if (spec_.identity) return u;
  if (spec_.q_rows == 0) return OrthogonalizeOne(u);
  // Fused QKV: rows [Q | K | V] per query group; each component is one matrix over all groups.
  const int64_t per = spec_.q_rows + 2 * spec_.kv_rows;
  const int64_t groups = u.rows / per;
  const int64_t first[3] = {0, spec_.q_rows, spec_.q_rows + spec_.kv_rows};
  const int64_t size[3] = {spec_.q_rows, spec_.kv_rows, spec_.kv_rows};
  Matrix o(u.rows, u.cols);
  for (int c = 0; c < 3; ++c) {
    Matrix part(groups * size[c], u.cols);
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t r = 0; r < size[c]; ++r) {
        for (int64_t j = 0; j < u.cols; ++j)
          part(gi * size[c] + r, j) = u(gi * per + first[c] + r, j);
      }
    }
    const Matrix out = OrthogonalizeOne(part);
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t r = 0; r < size[c]; ++r) {
        for (int64_t j = 0; j < u.cols; ++j)
          o(gi * per + first[c] + r, j) = out(gi * size[c] + r, j);
      }
    }
  }
  return o;
}

void Muon64::Step(const Matrix& grad, double lr, double lambda, Matrix& p) {
  const Matrix o = Orthogonalized(grad, lr, lambda, p);
  for (size_t i = 0; i < p.v.size(); ++i) p.v[i] -= lr * o.v[i];
}

AdaptiveMuon64::AdaptiveMuon64(MuonSpec spec, int64_t rows, int64_t cols, bool normuon,
                               double beta2, double eps)
    : muon_(std::move(spec), rows, cols), normuon_(normuon), beta2_(beta2), eps_(eps) {
  if (!normuon) {
    moment_ = Matrix(rows, cols);
  } else {
    moment_ = rows >= cols ? Matrix(rows, 1) : Matrix(1, cols);
  }
}

void AdaptiveMuon64::Step(const Matrix& grad, double lr, double lambda, Matrix& p) {
  const Matrix o = muon_.Orthogonalized(grad, lr, lambda, p);
  if (!normuon_) {
    for (size_t i = 0; i < p.v.size(); ++i) {
      moment_.v[i] = beta2_ * moment_.v[i] + (1.0 - beta2_) * o.v[i] * o.v[i];
      p.v[i] -= lr * o.v[i] / (std::sqrt(moment_.v[i]) + eps_);
    }
    return;
  }
  const bool per_row = o.rows >= o.cols;
  for (int64_t k = 0; k < (per_row ? o.rows : o.cols); ++k) {
    double sum = 0.0;
    const int64_t count = per_row ? o.cols : o.rows;
    for (int64_t j = 0; j < count; ++j) {
      const double x = per_row ? o(k, j) : o(j, k);
      sum += x * x;
    }
    moment_.v[k] = beta2_ * moment_.v[k] + (1.0 - beta2_) * sum / count;
  }
  for (int64_t i = 0; i < o.rows; ++i) {
    for (int64_t j = 0; j < o.cols; ++j) {
      const double v = moment_.v[per_row ? i : j];
      p(i, j) -= lr * o(i, j) / std::sqrt(std::max(v, eps_));
    }
  }
}

}  // namespace ref
}  // namespace optstep
