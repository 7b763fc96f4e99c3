#include "server/optim/adaptive_muon.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/math/emerging.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {
namespace {

enum Slot : int { kSums = 0, kScale = 1 };

// Bytes per element of the second-moment pass: adamuon reads O, p, v and writes p, v (20);
// normuon reads O twice (sums, scale), writes it once, then reads O, p and writes p (24).
constexpr double kMoment2Bytes = 20.0;

}  // namespace

absl::StatusOr<std::unique_ptr<AdaptiveMuon>> AdaptiveMuon::Create(
    const std::string& owner, const AdaptiveMuonConfig& config) {
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<MuonCore> core, MuonCore::Create(owner, config.muon));
  Method method;
  if (config.moment2_method == "adamuon") {
    method = Method::kAdamuon;
  } else if (config.moment2_method == "normuon") {
    method = Method::kNormuon;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        owner, ": moment2_method '", config.moment2_method, "' is not one of adamuon, normuon"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "beta2", config.beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckEps(owner, "eps", config.eps));
  return std::unique_ptr<AdaptiveMuon>(new AdaptiveMuon(config, method, std::move(core)));
}

Shape AdaptiveMuon::NormuonMomentShape(const Shape& s) {
  return s[0] >= s[1] ? Shape{s[0], 1} : Shape{1, s[1]};
}

absl::Status AdaptiveMuon::CheckParam(const ParamInfo& param) const {
  return core_->CheckParam("adaptive_muon", param);
}

absl::Status AdaptiveMuon::InitState(Device& device, const ParamInfo& param,
                                     ParamState& state) const {
  OPTSTEP_RETURN_IF_ERROR(core_->InitState(device, param, state));
  const Shape shape = method_ == Method::kAdamuon ? param.shape : NormuonMomentShape(param.shape);
  OPTSTEP_ASSIGN_OR_RETURN(Tensor moment, device.Allocate(DType::kF32, shape));
  state.tensors.emplace_back("moment2_buffer", std::move(moment));
  return absl::OkStatus();
}

int64_t AdaptiveMuon::StateBytes(const ParamInfo& param) const {
  const Shape shape = method_ == Method::kAdamuon ? param.shape : NormuonMomentShape(param.shape);
  return core_->StateBytes(param) + NumElements(shape) * 4;
}

void AdaptiveMuon::PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const {
  core_->PlanWorkspace(param, plan.Part(0));
  if (method_ == Method::kAdamuon) return;
  const Shape shape = NormuonMomentShape(param.shape);
  plan.Need(kSums, DType::kF32, shape);
  plan.Need(kScale, DType::kF32, shape);
}

absl::Status AdaptiveMuon::Step(Device& device, const StepArgs& args, const Tensor& grad,
                                Tensor& param, ParamState& state) {
  Tensor* moment = state.Find("moment2_buffer");
  if (moment == nullptr) {
    return absl::InternalError("adaptive_muon: state is missing moment2_buffer");
  }
  OPTSTEP_ASSIGN_OR_RETURN(Tensor o, core_->Orthogonalized(device, args, grad, param, state));
  if (method_ == Method::kAdamuon) {
    const math::Moment2Args a = math::MakeMoment2Args(args.lr, config_.beta2, config_.eps, 1);
    return device.updates().Adamuon(a, o, param, *moment);
  }
  // normuon: the mean of O² along the axis the moment keeps, then O ⊙ 1/√max(v, ε).
  const bool per_row = moment->dim(1) == 1 && param.dim(0) >= param.dim(1);
  const int64_t count = per_row ? param.dim(1) : param.dim(0);
  const math::Moment2Args a = math::MakeMoment2Args(args.lr, config_.beta2, config_.eps, count);
  OPTSTEP_ASSIGN_OR_RETURN(Tensor sums,
                           workspace_.Get(device, kSums, DType::kF32, moment->shape()));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor scale,
                           workspace_.Get(device, kScale, DType::kF32, moment->shape()));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().AxisDot(o, o, sums));
  OPTSTEP_RETURN_IF_ERROR(device.updates().NormuonMoment(a, sums, *moment, scale));
  OPTSTEP_RETURN_IF_ERROR(device.matrix().AxisScale(scale, o));
  return device.Axpby(-static_cast<float>(args.lr), o, 1.0f, param);
}

double AdaptiveMuon::EstimateStepCost(const ParamInfo& param) const {
  return core_->EstimateStepCost(param) + kMoment2Bytes * static_cast<double>(param.numel());
}

}  // namespace optstep
