#include "server/optim/adamw.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(const std::string& owner,
                                                     const AdamWConfig& config) {
  OPTSTEP_RETURN_IF_ERROR(CheckLearningRate(owner, config.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta1", config.beta1));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta2", config.beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckEps(owner, "eps", config.eps));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecay(owner, config.weight_decay));
  return std::unique_ptr<AdamW>(new AdamW(config));
}

absl::Status AdamW::CheckParam(const ParamInfo&) const { return absl::OkStatus(); }

absl::Status AdamW::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  for (const char* key : {"exp_avg", "exp_avg_sq"}) {
    OPTSTEP_ASSIGN_OR_RETURN(Tensor tensor, device.Allocate(DType::kF32, param.shape));
    state.tensors.emplace_back(key, std::move(tensor));
  }
  return absl::OkStatus();
}

int64_t AdamW::StateBytes(const ParamInfo& param) const { return 2 * param.numel() * 4; }

void AdamW::PlanWorkspace(const ParamInfo&, WorkspacePlan&) const {}

namespace {

// The moments of `state`, or INTERNAL when they are missing.
absl::Status FindMoments(ParamState& state, Tensor** exp_avg, Tensor** exp_avg_sq) {
  *exp_avg = state.Find("exp_avg");
  *exp_avg_sq = state.Find("exp_avg_sq");
  if (*exp_avg == nullptr || *exp_avg_sq == nullptr) {
    return absl::InternalError("adamw: state is missing exp_avg or exp_avg_sq");
  }
  return absl::OkStatus();
}

}  // namespace

math::AdamWArgs AdamW::KernelArgs(const StepArgs& args) const {
  math::AdamWArgs a =
      math::MakeAdamWArgs(args.lr, config_.beta1, config_.beta2, config_.eps, args.weight_decay,
                          config_.decoupled, config_.bias_correction, args.group_step);
  a.grad_scale = args.grad_scale;
  return a;
}

absl::Status AdamW::Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                         ParamState& state) {
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  OPTSTEP_RETURN_IF_ERROR(FindMoments(state, &exp_avg, &exp_avg_sq));
  return device.updates().AdamW(KernelArgs(args), grad, param, *exp_avg, *exp_avg_sq);
}

absl::Status AdamW::StepBatch(Device& device, const StepArgs& args,
                              absl::Span<const StepOperands> batch) {
  std::vector<AdamWOperands> operands(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    operands[i].grad = batch[i].grad;
    operands[i].param = batch[i].param;
    OPTSTEP_RETURN_IF_ERROR(
        FindMoments(*batch[i].state, &operands[i].exp_avg, &operands[i].exp_avg_sq));
  }
  return device.updates().AdamWBatch(KernelArgs(args), operands);
}

double AdamW::EstimateStepCost(const ParamInfo& param) const {
  return 28.0 * static_cast<double>(param.numel());
}

}  // namespace optstep
