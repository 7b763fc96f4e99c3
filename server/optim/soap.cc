#include "server/optim/soap.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/math/emerging.h"
#include "kernels/math/weight_decay.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {
namespace {

// Workspace slots (m×n): the l2-decayed gradient and later U; G'; D.
enum Slot : int { kGradOrUpdate = 0, kProjected = 1, kDirection = 2 };

// q ← I. REQUIRES: q zero-filled (as Device::Allocate gives it): only the diagonal is written,
// one element at a time, so that no n×n host matrix is needed.
absl::Status Identity(Device& device, int64_t n, Tensor& q) {
  const float one = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    OPTSTEP_RETURN_IF_ERROR(device.CopyFromHost(&one, DType::kF32, 1, q, i * n + i));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Soap>> Soap::Create(const std::string& owner, const SoapConfig& c) {
  OPTSTEP_RETURN_IF_ERROR(CheckLearningRate(owner, c.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta1", c.beta1));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta2", c.beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "shampoo_beta", c.shampoo_beta));
  OPTSTEP_RETURN_IF_ERROR(CheckEps(owner, "eps", c.eps));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecay(owner, c.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecayMode(owner, c.weight_decay_mode));
  OPTSTEP_RETURN_IF_ERROR(CheckCount(owner, "precondition_frequency", c.precondition_frequency, 1,
                                     kMaxPreconditionFrequency));
  OPTSTEP_RETURN_IF_ERROR(
      CheckCount(owner, "warmup_steps", c.warmup_steps, 0, std::numeric_limits<int64_t>::max()));
  OPTSTEP_RETURN_IF_ERROR(
      CheckCount(owner, "power_iter_steps", c.power_iter_steps, 1, kMaxPowerIterSteps));
  OPTSTEP_RETURN_IF_ERROR(
      CheckNonNegative(owner, "adaptive_update_tolerance", c.adaptive_update_tolerance));
  OPTSTEP_RETURN_IF_ERROR(CheckNonNegative(owner, "max_update_rms", c.max_update_rms));
  OPTSTEP_ASSIGN_OR_RETURN(
      MatmulPrecision precision,
      ParseMatmulPrecision(absl::StrCat(owner, ": fp32_matmul_prec"), c.fp32_matmul_prec));
  OPTSTEP_ASSIGN_OR_RETURN(
      MatmulPrecision qr_precision,
      ParseMatmulPrecision(absl::StrCat(owner, ": qr_fp32_matmul_prec"), c.qr_fp32_matmul_prec));
  return std::unique_ptr<Soap>(new Soap(c, precision, qr_precision));
}

absl::Status Soap::CheckParam(const ParamInfo& param) const {
  if (param.ndim() == 2 && std::max(param.shape[0], param.shape[1]) > kMaxDimension) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name,
                                                   "': soap takes dimensions up to ", kMaxDimension,
                                                   ", got shape ", ShapeString(param.shape)));
  }
  if (param.ndim() == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("param '", param.name,
                                                 "': soap needs a 2-D parameter, got shape ",
                                                 ShapeString(param.shape)));
}

absl::Status Soap::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  const int64_t m = param.shape[0];
  const int64_t n = param.shape[1];
  const std::pair<const char*, Shape> keys[] = {
      {"exp_avg", {m, n}}, {"exp_avg_sq", {m, n}}, {"L", {m, m}},
      {"R", {n, n}},       {"Q_L", {m, m}},        {"Q_R", {n, n}},
  };
  for (const auto& [key, shape] : keys) {
    OPTSTEP_ASSIGN_OR_RETURN(Tensor t, device.Allocate(DType::kF32, shape));
    state.tensors.emplace_back(key, std::move(t));
  }
  OPTSTEP_RETURN_IF_ERROR(Identity(device, m, *state.Find("Q_L")));
  return Identity(device, n, *state.Find("Q_R"));
}

int64_t Soap::StateBytes(const ParamInfo& param) const {
  const int64_t m = param.shape[0];
  const int64_t n = param.shape[1];
  return (2 * m * n + 2 * m * m + 2 * n * n) * 4;  // exp_avg, exp_avg_sq, L, Q_L, R, Q_R
}

void Soap::PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const {
  for (Slot slot : {kGradOrUpdate, kProjected, kDirection})
    plan.Need(slot, DType::kF32, param.shape);
  SoapLinalg::PlanWorkspace(param.shape[0], param.shape[1], plan.Part(0));
}

absl::Status Soap::Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                        ParamState& state) {
  SoapState s{state.Find("exp_avg"), state.Find("exp_avg_sq"), state.Find("L"),
              state.Find("R"),       state.Find("Q_L"),        state.Find("Q_R")};
  for (Tensor* t : {s.exp_avg, s.exp_avg_sq, s.left, s.right, s.q_left, s.q_right}) {
    if (t == nullptr) return absl::InternalError("soap: state is incomplete");
  }
  const int64_t step = args.group_step - 1;  // s, 0-based
  const int64_t t = step + 1;
  const int64_t warmup = config_.warmup_steps;
  const bool projected = step >= warmup;

  // S0-S1.
  double beta = config_.shampoo_beta;
  if (config_.correct_shampoo_beta_bias.value_or(config_.correct_bias)) {
    beta = 1.0 - (1.0 - beta) / (1.0 - std::pow(beta, static_cast<double>(t)));
  }
  OPTSTEP_RETURN_IF_ERROR(linalg_.UpdateFactors(device, precision_, config_.use_kl_shampoo, beta,
                                                config_.eps, grad, s));
  // S2.
  if (projected && step % config_.precondition_frequency == 0) {
    bool refresh = true;
    if (config_.use_adaptive_criteria && step > warmup) {
      OPTSTEP_ASSIGN_OR_RETURN(refresh, linalg_.NeedsRefresh(device, qr_precision_,
                                                             config_.adaptive_update_tolerance, s));
    }
    if (refresh) {
      OPTSTEP_RETURN_IF_ERROR(linalg_.RefreshBasis(
          device, qr_precision_, config_.use_eigh || step == warmup, config_.power_iter_steps, s));
    }
  }
  // S3.
  const math::WeightDecay decay =
      math::MakeWeightDecay(config_.weight_decay_mode, args.lr, args.weight_decay);
  const Tensor* g = &grad;
  Tensor decayed;
  if (decay.l2) {
    OPTSTEP_ASSIGN_OR_RETURN(decayed,
                             workspace_.Get(device, kGradOrUpdate, DType::kF32, grad.shape()));
    OPTSTEP_RETURN_IF_ERROR(device.Copy(grad, decayed));
    OPTSTEP_RETURN_IF_ERROR(device.Axpby(decay.coef, param, 1.0f, decayed));
    g = &decayed;
  } else if (decay.coef != 0.0f) {
    OPTSTEP_RETURN_IF_ERROR(device.Axpby(decay.coef, param, 1.0f, param));
  }
  // S4-S6.
  Tensor rotated;
  if (projected) {
    OPTSTEP_ASSIGN_OR_RETURN(rotated,
                             workspace_.Get(device, kProjected, DType::kF32, grad.shape()));
    OPTSTEP_RETURN_IF_ERROR(linalg_.Rotate(device, precision_, true, s, *g, rotated));
    g = &rotated;
  }
  OPTSTEP_ASSIGN_OR_RETURN(Tensor direction,
                           workspace_.Get(device, kDirection, DType::kF32, grad.shape()));
  const math::SoapAdamArgs adam = math::MakeSoapAdamArgs(config_.beta1, config_.beta2, config_.eps,
                                                         config_.correct_bias, config_.nesterov, t);
  OPTSTEP_RETURN_IF_ERROR(
      device.updates().SoapAdam(adam, *g, *s.exp_avg, *s.exp_avg_sq, direction));
  Tensor update;
  if (projected) {
    OPTSTEP_ASSIGN_OR_RETURN(update,
                             workspace_.Get(device, kGradOrUpdate, DType::kF32, grad.shape()));
    OPTSTEP_RETURN_IF_ERROR(linalg_.Rotate(device, precision_, false, s, direction, update));
  } else {
    update = Tensor(DType::kF32, grad.shape(), direction.data(), Tensor::Deleter());
  }
  // S7-S8.
  double factor = 1.0;
  if (config_.max_update_rms > 0.0) {
    OPTSTEP_ASSIGN_OR_RETURN(GradientStats stats, device.ComputeGradientStats(update));
    const double rms = std::sqrt(stats.sum_squares / static_cast<double>(update.numel()));
    factor = std::min(1.0, config_.max_update_rms / (rms + 1e-7));
  }
  return device.Axpby(static_cast<float>(-args.lr * factor), update, 1.0f, param);
}

double Soap::EstimateStepCost(const ParamInfo& param) const {
  const double numel = static_cast<double>(param.numel());
  const double m = static_cast<double>(param.shape[0]);
  const double n = static_cast<double>(param.shape[1]);
  const double mixed = m * m * n + m * n * n;
  const double cubes = m * m * m + n * n * n;
  double flops = 2.0 * mixed + 4.0 * mixed;  // factors + two rotations
  if (config_.use_kl_shampoo) flops += 4.0 * cubes + 4.0 * mixed;
  const double solve =
      config_.use_eigh ? 9.0 : 2.0 * static_cast<double>(config_.power_iter_steps) + 8.0 / 3.0;
  flops += (4.0 * mixed + solve * cubes) / static_cast<double>(config_.precondition_frequency);
  return 40.0 * numel + flops / Optimizer::kFlopsPerByte;
}

}  // namespace optstep
