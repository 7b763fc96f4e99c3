#include "server/optim/sgd.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Sgd>> Sgd::Create(const std::string& owner,
                                                 const SgdConfig& config) {
  OPTSTEP_RETURN_IF_ERROR(CheckLearningRate(owner, config.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "momentum", config.momentum));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecay(owner, config.weight_decay));
  if (config.nesterov && config.momentum <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": nesterov requires momentum > 0, got momentum = ", config.momentum));
  }
  return std::unique_ptr<Sgd>(new Sgd(config));
}

absl::Status Sgd::CheckParam(const ParamInfo&) const { return absl::OkStatus(); }

absl::Status Sgd::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  if (config_.momentum == 0.0) return absl::OkStatus();
  OPTSTEP_ASSIGN_OR_RETURN(Tensor buffer, device.Allocate(DType::kF32, param.shape));
  state.tensors.emplace_back("momentum_buffer", std::move(buffer));
  return absl::OkStatus();
}

int64_t Sgd::StateBytes(const ParamInfo& param) const {
  return config_.momentum == 0.0 ? 0 : param.numel() * 4;
}

void Sgd::PlanWorkspace(const ParamInfo&, WorkspacePlan&) const {}

absl::Status Sgd::Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                       ParamState& state) {
  math::SgdArgs a;
  a.lr = static_cast<float>(args.lr);
  a.momentum = static_cast<float>(config_.momentum);
  a.weight_decay = static_cast<float>(args.weight_decay);
  a.nesterov = config_.nesterov;
  a.first_step = args.group_step == 1;
  a.grad_scale = args.grad_scale;
  Tensor* buffer = state.Find("momentum_buffer");
  if (config_.momentum != 0.0 && buffer == nullptr) {
    return absl::InternalError("sgd: state is missing momentum_buffer");
  }
  return device.updates().Sgd(a, grad, param, buffer);
}

double Sgd::EstimateStepCost(const ParamInfo& param) const {
  return (config_.momentum != 0.0 ? 20.0 : 12.0) * static_cast<double>(param.numel());
}

}  // namespace optstep
