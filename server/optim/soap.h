#ifndef OPTSTEP_SERVER_OPTIM_SOAP_H_
#define OPTSTEP_SERVER_OPTIM_SOAP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/matrix_types.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/soap_linalg.h"
#include "server/optim/workspace.h"

namespace optstep {

// SOAP (spec §3.6): Shampoo's Kronecker-factor eigenbasis + Adam in the rotated basis. One step,
// in the reference's order (s = the step count before it, t = s + 1):
//   S0 β ← β_s, bias-corrected to 1 − (1 − β_s)/(1 − β_s^t) when correct_shampoo_beta_bias
//   S1 factors (plain or KL-Shampoo), under fp32_matmul_prec
//   S2 eigenbasis refresh when s ≥ W and s mod F == 0 (unless the adaptive criterion skips it):
//      eigh at s == W or with use_eigh, power iteration + QR otherwise; under qr_fp32_matmul_prec
//   S3 weight decay (decoupled by default; l2 adds λ·p to the gradient the moments see)
//   S4 G' ← Q_Lᵀ·G·Q_R (s ≥ W)   S5 Adam   S6 U ← Q_L·D·Q_Rᵀ (s ≥ W)
//   S7 U ← U·min(1, max_update_rms/(rms(U) + 1e-7)) when max_update_rms > 0   S8 p ← p − η·U
// The step count is the group's applied-step count (StepArgs::group_step − 1): all parameters of
// a group advance together (spec §7.1 stores it once). Only 2-D parameters. State per m×n
// parameter: "exp_avg" (m×n), "exp_avg_sq" (m×n), "L" (m×m), "R" (n×n), "Q_L" (m×m, identity),
// "Q_R" (n×n, identity). Thread-compatible.
class Soap final : public Optimizer {
 public:
  // INVALID_ARGUMENT naming `owner`: lr < 0, betas or shampoo_beta ∉ [0, 1), eps < 0,
  // weight_decay < 0, precondition_frequency < 1, warmup_steps < 0, power_iter_steps < 1,
  // adaptive_update_tolerance < 0, max_update_rms < 0, unknown precisions or mode.
  static absl::StatusOr<std::unique_ptr<Soap>> Create(const std::string& owner,
                                                      const SoapConfig& config);

  // The largest dimension of a parameter: its factor and eigenbasis (4 TiB each at this size)
  // are then counted without overflow.
  static constexpr int64_t kMaxDimension = int64_t{1} << 20;

  std::string kind() const override { return "soap"; }
  double default_lr() const override { return config_.lr; }
  double default_weight_decay() const override { return config_.weight_decay; }
  // INVALID_ARGUMENT naming the parameter unless it is 2-D with both dimensions at most
  // kMaxDimension.
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  // Bytes of the element-wise passes (~40 per element) plus flops / kFlopsPerByte of the factor
  // update (2·(m²n + mn²); KL adds 4·(m³ + n³) + 4·(m²n + mn²)), the two rotations
  // (4·(m²n + mn²)) and the refresh amortised over F: 4·(m²n + mn²) for M plus
  // (2·power_iter_steps + 8/3)·(m³ + n³) for power iteration + QR (9·(m³ + n³) with use_eigh).
  double EstimateStepCost(const ParamInfo& param) const override;

 private:
  Soap(const SoapConfig& config, MatmulPrecision precision, MatmulPrecision qr_precision)
      : config_(config), precision_(precision), qr_precision_(qr_precision) {}

  const SoapConfig config_;
  const MatmulPrecision precision_;     // factors and projections
  const MatmulPrecision qr_precision_;  // eigenbasis refresh
  SoapLinalg linalg_;
  Workspace workspace_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_SOAP_H_
