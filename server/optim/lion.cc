#include "server/optim/lion.h"

#include "base/status_macros.h"
#include "kernels/math/emerging.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Lion>> Lion::Create(const std::string& owner,
                                                   const LionConfig& config) {
  OPTSTEP_RETURN_IF_ERROR(CheckLearningRate(owner, config.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta1", config.beta1));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta2", config.beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecay(owner, config.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecayMode(owner, config.weight_decay_mode));
  return std::unique_ptr<Lion>(new Lion(config));
}

absl::Status Lion::CheckParam(const ParamInfo&) const { return absl::OkStatus(); }

absl::Status Lion::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  OPTSTEP_ASSIGN_OR_RETURN(Tensor exp_avg, device.Allocate(DType::kF32, param.shape));
  state.tensors.emplace_back("exp_avg", std::move(exp_avg));
  return absl::OkStatus();
}

int64_t Lion::StateBytes(const ParamInfo& param) const { return param.numel() * 4; }

void Lion::PlanWorkspace(const ParamInfo&, WorkspacePlan&) const {}

absl::Status Lion::Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                        ParamState& state) {
  Tensor* exp_avg = state.Find("exp_avg");
  if (exp_avg == nullptr) return absl::InternalError("lion: state is missing exp_avg");
  math::LionArgs a = math::MakeLionArgs(args.lr, config_.beta1, config_.beta2,
                                        config_.weight_decay_mode, args.weight_decay);
  a.grad_scale = args.grad_scale;
  return device.updates().Lion(a, grad, param, *exp_avg);
}

double Lion::EstimateStepCost(const ParamInfo& param) const {
  return 20.0 * static_cast<double>(param.numel());
}

}  // namespace optstep
