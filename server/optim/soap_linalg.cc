#include "server/optim/soap_linalg.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/status_macros.h"

namespace optstep {
namespace {

// Workspace slots. Squares come in pairs per factor (L: 0, 1; R: 2, 3); vectors one per factor.
enum Slot : int {
  kSquare = 0,
  kVector = 4,
  kRotate = 6,
  kMatrix = 7,
  kPermuted = 8,
  kEigenvalues = 9,
};

int SquareSlot(int factor, int which) { return kSquare + 2 * factor + which; }

absl::StatusOr<std::vector<float>> Download(Device& device, const Tensor& t) {
  std::vector<float> host(t.numel());
  OPTSTEP_RETURN_IF_ERROR(device.CopyToHost(t, 0, t.numel(), DType::kF32, host.data()));
  return host;
}

GemmArgs Product(MatmulPrecision p, bool ta, bool tb, float alpha = 1.0f, float beta = 0.0f) {
  return GemmArgs{p, ta, tb, alpha, beta};
}

}  // namespace

void SoapLinalg::PlanWorkspace(int64_t m, int64_t n, WorkspacePlan& plan) {
  const int64_t dims[2] = {m, n};  // factor 0 (L) is m×m, factor 1 (R) n×n
  for (int factor = 0; factor < 2; ++factor) {
    const int64_t d = dims[factor];
    plan.Need(SquareSlot(factor, 0), DType::kF32, {d, d});
    plan.Need(SquareSlot(factor, 1), DType::kF32, {d, d});
    plan.Need(kVector + factor, DType::kF32, {1, d});
  }
  for (Slot slot : {kRotate, kMatrix, kPermuted}) plan.Need(slot, DType::kF32, {m, n});
  plan.Need(kEigenvalues, DType::kF32, {std::max(m, n)});
}

absl::StatusOr<Tensor> SoapLinalg::RayleighDiagonal(Device& device, MatmulPrecision precision,
                                                    const Tensor& k, const Tensor& q,
                                                    int slot_square, int slot_vector) {
  const int64_t n = k.dim(0);
  OPTSTEP_ASSIGN_OR_RETURN(Tensor kq, workspace_.Get(device, slot_square, DType::kF32, {n, n}));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, false, false), k, q, kq));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor diag, workspace_.Get(device, slot_vector, DType::kF32, {1, n}));
  // (Qᵀ·K·Q)_jj = Σ_i Q_ij·(K·Q)_ij.
  OPTSTEP_RETURN_IF_ERROR(device.matrix().AxisDot(q, kq, diag));
  return diag;
}

absl::StatusOr<Tensor> SoapLinalg::KlPreconditioner(Device& device, MatmulPrecision precision,
                                                    const Tensor& k, const Tensor& q, double eps,
                                                    int slot_square, int slot_vector,
                                                    int slot_out) {
  const int64_t n = k.dim(0);
  OPTSTEP_ASSIGN_OR_RETURN(Tensor lambda,
                           RayleighDiagonal(device, precision, k, q, slot_square, slot_vector));
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<float> w, Download(device, lambda));
  const double floor = static_cast<float>(eps);
  for (float& x : w) {
    x = static_cast<float>(1.0 / (static_cast<double>(n) * std::max<double>(x, floor)));
  }
  OPTSTEP_RETURN_IF_ERROR(device.CopyFromHost(w.data(), DType::kF32, n, lambda, 0));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor scaled, workspace_.Get(device, slot_square, DType::kF32, {n, n}));
  OPTSTEP_RETURN_IF_ERROR(device.Copy(q, scaled));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().AxisScale(lambda, scaled));  // Q·diag(w)
  OPTSTEP_ASSIGN_OR_RETURN(Tensor c, workspace_.Get(device, slot_out, DType::kF32, {n, n}));
  // Q·diag(w)·Qᵀ is symmetric.
  OPTSTEP_RETURN_IF_ERROR(
      device.matrix().SymmetricGemm(Product(precision, false, true), scaled, q, c));
  return c;
}

absl::Status SoapLinalg::UpdateFactors(Device& device, MatmulPrecision precision, bool kl,
                                       double beta, double eps, const Tensor& grad, SoapState& s) {
  const float a = static_cast<float>(1.0 - beta);
  const float b = static_cast<float>(beta);
  if (!kl) {
    OPTSTEP_RETURN_IF_ERROR(
        device.matrix().SymmetricGemm(Product(precision, false, true, a, b), grad, grad, *s.left));
    return device.matrix().SymmetricGemm(Product(precision, true, false, a, b), grad, grad,
                                         *s.right);
  }
  // Both preconditioners from the pre-update factors and the current bases.
  OPTSTEP_ASSIGN_OR_RETURN(
      Tensor c_left, KlPreconditioner(device, precision, *s.left, *s.q_left, eps, SquareSlot(0, 0),
                                      kVector, SquareSlot(0, 1)));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor c_right,
                           KlPreconditioner(device, precision, *s.right, *s.q_right, eps,
                                            SquareSlot(1, 0), kVector + 1, SquareSlot(1, 1)));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor t, workspace_.Get(device, kMatrix, DType::kF32, grad.shape()));
  // G·C_R·Gᵀ and Gᵀ·C_L·G are symmetric (C_L, C_R are).
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, false, false), grad, c_right, t));
  OPTSTEP_RETURN_IF_ERROR(
      device.matrix().SymmetricGemm(Product(precision, false, true, a, b), t, grad, *s.left));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, false, false), c_left, grad, t));
  return device.matrix().SymmetricGemm(Product(precision, true, false, a, b), grad, t, *s.right);
}

absl::StatusOr<bool> SoapLinalg::NeedsRefresh(Device& device, MatmulPrecision precision,
                                              double tolerance, const SoapState& s) {
  const Tensor* factors[2][2] = {{s.left, s.q_left}, {s.right, s.q_right}};
  for (int f = 0; f < 2; ++f) {
    const Tensor& k = *factors[f][0];
    OPTSTEP_ASSIGN_OR_RETURN(GradientStats k_stats, device.ComputeGradientStats(k));
    OPTSTEP_ASSIGN_OR_RETURN(Tensor diag, RayleighDiagonal(device, precision, k, *factors[f][1],
                                                           SquareSlot(f, 0), kVector + f));
    OPTSTEP_ASSIGN_OR_RETURN(GradientStats d_stats, device.ComputeGradientStats(diag));
    const double k_norm = std::sqrt(k_stats.sum_squares);
    const double d_norm = std::sqrt(d_stats.sum_squares);
    if (tolerance * k_norm < k_norm - d_norm) return true;
  }
  return false;
}

absl::Status SoapLinalg::PowerIteration(Device& device, MatmulPrecision precision, const Tensor& k,
                                        Tensor& q, int axis, int64_t steps, Tensor& v) {
  const int factor = axis;  // L permutes V's rows (axis 0), R its columns (axis 1)
  const int64_t n = k.dim(0);
  OPTSTEP_ASSIGN_OR_RETURN(
      Tensor lambda,
      RayleighDiagonal(device, precision, k, q, SquareSlot(factor, 0), kVector + factor));
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<float> values, Download(device, lambda));
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t i, int64_t j) { return values[i] > values[j]; });
  OPTSTEP_ASSIGN_OR_RETURN(Tensor permuted_v,
                           workspace_.Get(device, kPermuted, DType::kF32, v.shape()));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Permute(v, axis, order, permuted_v));
  OPTSTEP_RETURN_IF_ERROR(device.Copy(permuted_v, v));
  // K·Q[:, π] = (K·Q)[:, π]: the first power iteration reuses the product just formed.
  OPTSTEP_ASSIGN_OR_RETURN(Tensor kq,
                           workspace_.Get(device, SquareSlot(factor, 0), DType::kF32, {n, n}));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor permuted,
                           workspace_.Get(device, SquareSlot(factor, 1), DType::kF32, {n, n}));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Permute(kq, 1, order, permuted));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Qr(permuted, q));
  for (int64_t i = 1; i < steps; ++i) {
    OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, false, false), k, q, kq));
    OPTSTEP_RETURN_IF_ERROR(device.matrix().Qr(kq, q));
  }
  return absl::OkStatus();
}

absl::Status SoapLinalg::RefreshBasis(Device& device, MatmulPrecision precision, bool eigh,
                                      int64_t power_iter_steps, SoapState& s) {
  Tensor& m = *s.exp_avg;
  OPTSTEP_ASSIGN_OR_RETURN(Tensor t, workspace_.Get(device, kMatrix, DType::kF32, m.shape()));
  OPTSTEP_RETURN_IF_ERROR(Rotate(device, precision, /*into_eigenbasis=*/false, s, m, t));
  OPTSTEP_RETURN_IF_ERROR(device.Copy(t, m));
  if (eigh) {
    for (auto [k, q] : {std::pair<Tensor*, Tensor*>{s.left, s.q_left}, {s.right, s.q_right}}) {
      OPTSTEP_ASSIGN_OR_RETURN(Tensor values,
                               workspace_.Get(device, kEigenvalues, DType::kF32, {k->dim(0)}));
      OPTSTEP_RETURN_IF_ERROR(device.matrix().SymmetricEigh(*k, kEighShift, values, *q));
    }
  } else {
    OPTSTEP_RETURN_IF_ERROR(
        PowerIteration(device, precision, *s.left, *s.q_left, 0, power_iter_steps, *s.exp_avg_sq));
    OPTSTEP_RETURN_IF_ERROR(PowerIteration(device, precision, *s.right, *s.q_right, 1,
                                           power_iter_steps, *s.exp_avg_sq));
  }
  OPTSTEP_RETURN_IF_ERROR(Rotate(device, precision, /*into_eigenbasis=*/true, s, m, t));
  return device.Copy(t, m);
}

absl::Status SoapLinalg::Rotate(Device& device, MatmulPrecision precision, bool into_eigenbasis,
                                const SoapState& s, const Tensor& x, Tensor& out) {
  OPTSTEP_ASSIGN_OR_RETURN(Tensor t, workspace_.Get(device, kRotate, DType::kF32, x.shape()));
  if (into_eigenbasis) {
    OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, true, false), *s.q_left, x, t));
    return device.matrix().Gemm(Product(precision, false, false), t, *s.q_right, out);
  }
  OPTSTEP_RETURN_IF_ERROR(device.matrix().Gemm(Product(precision, false, false), *s.q_left, x, t));
  return device.matrix().Gemm(Product(precision, false, true), t, *s.q_right, out);
}

}  // namespace optstep
