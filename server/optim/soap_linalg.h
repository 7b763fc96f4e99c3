#ifndef OPTSTEP_SERVER_OPTIM_SOAP_LINALG_H_
#define OPTSTEP_SERVER_OPTIM_SOAP_LINALG_H_

// The matrix steps of SOAP (docs/spec/optimizers.md §3.6.3) over kernels::Device: the Kronecker
// factor update (S1, plain and KL-Shampoo), the adaptive refresh criterion and the eigenbasis
// refresh (S2: eigh, or power iteration + QR with the second-moment permutation), and the
// rotations into and out of the eigenbasis (S4, S6).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"
#include "server/optim/workspace.h"

namespace optstep {

// The state of one m×n parameter (views owned by its ParamState).
struct SoapState {
  Tensor* exp_avg = nullptr;     // M, m×n, in the current eigenbasis
  Tensor* exp_avg_sq = nullptr;  // V, m×n
  Tensor* left = nullptr;        // L, m×m
  Tensor* right = nullptr;       // R, n×n
  Tensor* q_left = nullptr;      // Q_L, m×m
  Tensor* q_right = nullptr;     // Q_R, n×n
};

// Owns the m×m, n×n and m×n scratch of these steps (Workspace). Thread-compatible.
class SoapLinalg {
 public:
  // S1. plain: L ← β·L + (1−β)·G·Gᵀ; R ← β·R + (1−β)·Gᵀ·G. KL-Shampoo: with the pre-update
  // factors and the current bases, C_L = Q_L·diag(1/(m·max(λ_L, ε)))·Q_Lᵀ (λ_L =
  // diag(Q_Lᵀ·L·Q_L)), C_R likewise; then L ← β·L + (1−β)·G·C_R·Gᵀ and R ← β·R + (1−β)·Gᵀ·C_L·G.
  absl::Status UpdateFactors(Device& device, MatmulPrecision precision, bool kl, double beta,
                             double eps, const Tensor& grad, SoapState& s);

  // S2's adaptive criterion: false (skip the refresh) when for both (K, Q) ∈ {(L, Q_L), (R, Q_R)}
  // τ·‖K‖_F ≥ ‖K‖_F − ‖diag(Qᵀ·K·Q)‖₂.
  absl::StatusOr<bool> NeedsRefresh(Device& device, MatmulPrecision precision, double tolerance,
                                    const SoapState& s);

  // S2 a-c: M back to parameter space; new bases (eigh: eigenvectors of K + 1e-7·I by
  // descending eigenvalue, V untouched; otherwise, L then R: sort by diag(Qᵀ·K·Q) with the old Q
  // (stable, descending), permute V's rows (L) / columns (R) and Q's columns alike, then
  // `power_iter_steps` times Q ← qr(K·Q).Q); M into the new bases.
  absl::Status RefreshBasis(Device& device, MatmulPrecision precision, bool eigh,
                            int64_t power_iter_steps, SoapState& s);

  // out ← Q_Lᵀ·x·Q_R (into the eigenbasis) or Q_L·x·Qᵣᵀ (back). x and out: distinct m×n.
  absl::Status Rotate(Device& device, MatmulPrecision precision, bool into_eigenbasis,
                      const SoapState& s, const Tensor& x, Tensor& out);

  // The scratch of every step above for an m×n parameter, over all their branches (see
  // Workspace, WorkspacePlan).
  static void PlanWorkspace(int64_t m, int64_t n, WorkspacePlan& plan);

  // The shift of the eigh path for fp32 factors.
  static constexpr float kEighShift = 1e-7f;

 private:
  // λ = diag(Qᵀ·K·Q) as a {1, n} tensor (a view of `slot_vector`).
  absl::StatusOr<Tensor> RayleighDiagonal(Device& device, MatmulPrecision precision,
                                          const Tensor& k, const Tensor& q, int slot_square,
                                          int slot_vector);
  // C = Q·diag(1/(n·max(λ, ε)))·Qᵀ into a view of `slot_out`.
  absl::StatusOr<Tensor> KlPreconditioner(Device& device, MatmulPrecision precision,
                                          const Tensor& k, const Tensor& q, double eps,
                                          int slot_square, int slot_vector, int slot_out);
  // One factor's orthogonal-iteration refresh; permutes V along `axis`. The first iteration's
  // K·Q[:, π] is the column permutation of the K·Q that the sort already formed.
  absl::Status PowerIteration(Device& device, MatmulPrecision precision, const Tensor& k, Tensor& q,
                              int axis, int64_t steps, Tensor& v);

  Workspace workspace_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_SOAP_LINALG_H_
