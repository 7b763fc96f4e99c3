#include "server/optim/muon.h"

#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Muon>> Muon::Create(const std::string& owner,
                                                   const MuonConfig& config) {
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<MuonCore> core, MuonCore::Create(owner, config));
  return std::unique_ptr<Muon>(new Muon(std::move(core)));
}

absl::Status Muon::CheckParam(const ParamInfo& param) const {
  return core_->CheckParam("muon", param);
}

absl::Status Muon::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  return core_->InitState(device, param, state);
}

int64_t Muon::StateBytes(const ParamInfo& param) const { return core_->StateBytes(param); }

void Muon::PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const {
  core_->PlanWorkspace(param, plan);
}

absl::Status Muon::Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                        ParamState& state) {
  OPTSTEP_ASSIGN_OR_RETURN(Tensor o, core_->Orthogonalized(device, args, grad, param, state));
  return device.Axpby(-static_cast<float>(args.lr), o, 1.0f, param);
}

double Muon::EstimateStepCost(const ParamInfo& param) const {
  return core_->EstimateStepCost(param);
}

}  // namespace optstep
