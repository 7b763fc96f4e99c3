#include "server/optim/muon_core.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "kernels/math/emerging.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {
namespace {

// Workspace slots.
enum Slot : int { kUpdate = 0, kOrthogonal = 1, kComponentIn = 2, kComponentOut = 3 };

// Bytes per element of the element-wise parts: decay + momentum read g, p, b and write p, b, u
// (24); the final p ← p − η·O reads O, p and writes p (12).
constexpr double kElementwiseBytes = 36.0;

// Rows of one Q/K/V component within each query group.
struct Component {
  int64_t first_row;  // offset inside the group
  int64_t rows;       // rows per group
};

std::vector<Component> QkvComponents(const QkvSplitInfo& qkv) {
  const int64_t q = static_cast<int64_t>(qkv.q_per_group) * qkv.head_dim;
  const int64_t kv = qkv.head_dim;
  return {{0, q}, {q, kv}, {q + kv, kv}};
}

int64_t GroupRows(const QkvSplitInfo& qkv) {
  return (static_cast<int64_t>(qkv.q_per_group) + 2) * qkv.head_dim;
}

absl::StatusOr<NewtonSchulzOptions> NsOptions(const std::string& owner, const MuonConfig& c) {
  NewtonSchulzOptions ns;
  OPTSTEP_RETURN_IF_ERROR(CheckCount(owner, "num_ns_steps", c.num_ns_steps, 1, kMaxNsSteps));
  ns.num_steps = c.num_ns_steps;
  OPTSTEP_ASSIGN_OR_RETURN(ns.type, ParseCoefficientType(owner, c.coefficient_type));
  if (ns.type == CoefficientType::kCustom) {
    if (c.custom_coefficients.empty() || c.custom_coefficients.size() % 3 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          owner, ": coefficient_type 'custom' needs a non-empty list of (a, b, c) triples; got ",
          c.custom_coefficients.size(), " custom_coefficients"));
    }
    OPTSTEP_RETURN_IF_ERROR(CheckCount(owner, "rows of custom_coefficients",
                                       static_cast<int64_t>(c.custom_coefficients.size() / 3), 1,
                                       kMaxNsSteps));
    for (size_t i = 0; i < c.custom_coefficients.size(); i += 3) {
      for (size_t j = 0; j < 3; ++j) {
        if (!std::isfinite(c.custom_coefficients[i + j])) {
          return absl::InvalidArgumentError(absl::StrCat(owner, ": custom_coefficients[", i + j,
                                                         "] = ", c.custom_coefficients[i + j],
                                                         " is not finite"));
        }
      }
      ns.custom.push_back({static_cast<float>(c.custom_coefficients[i]),
                           static_cast<float>(c.custom_coefficients[i + 1]),
                           static_cast<float>(c.custom_coefficients[i + 2])});
    }
  } else if (!c.custom_coefficients.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(owner, ": custom_coefficients are given but ",
                                                   "coefficient_type is '", c.coefficient_type,
                                                   "', not 'custom'"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckEps(owner, "ns_eps", c.ns_eps));
  ns.eps = static_cast<float>(c.ns_eps);
  OPTSTEP_ASSIGN_OR_RETURN(
      ns.precision,
      ParseMatmulPrecision(absl::StrCat(owner, ": fp32_matmul_prec"), c.fp32_matmul_prec));
  return ns;
}

}  // namespace

absl::StatusOr<ScaleMode> ParseScaleMode(absl::string_view owner, absl::string_view name) {
  if (name == "spectral") return ScaleMode::kSpectral;
  if (name == "shape_scaling") return ScaleMode::kShapeScaling;
  if (name == "unit_rms_norm") return ScaleMode::kUnitRmsNorm;
  return absl::InvalidArgumentError(absl::StrCat(
      owner, ": scale_mode '", name, "' is not one of spectral, shape_scaling, unit_rms_norm"));
}

double MuonScaleFactor(ScaleMode mode, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  switch (mode) {
    case ScaleMode::kSpectral:
      return std::sqrt(std::max(r, c));
    case ScaleMode::kShapeScaling:
      return std::sqrt(std::max(1.0, r / c));
    case ScaleMode::kUnitRmsNorm:
      return std::sqrt(r / c);
  }
  return 1.0;
}

absl::StatusOr<std::unique_ptr<MuonCore>> MuonCore::Create(const std::string& owner,
                                                           const MuonConfig& config) {
  OPTSTEP_RETURN_IF_ERROR(CheckLearningRate(owner, config.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckUnitInterval(owner, "momentum", config.momentum));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecay(owner, config.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(CheckWeightDecayMode(owner, config.weight_decay_mode));
  OPTSTEP_ASSIGN_OR_RETURN(NewtonSchulzOptions ns, NsOptions(owner, config));
  OPTSTEP_ASSIGN_OR_RETURN(ScaleMode scale, ParseScaleMode(owner, config.scale_mode));
  OPTSTEP_RETURN_IF_ERROR(
      CheckPositive(owner, "extra_scale_factor", config.extra_scale_factor, kMaxScaleFactor));
  if (ns.type == CoefficientType::kAol) {
    LOG(WARNING) << owner << ": coefficient_type 'aol' flips the sign of a dominant singular "
                 << "direction (normalized sigma > 0.8837; spec §8.2 #1); reproduced as in "
                 << "Emerging-Optimizers v0.2.0";
  }
  return std::unique_ptr<MuonCore>(new MuonCore(config, std::move(ns), scale));
}

absl::Status MuonCore::CheckParam(absl::string_view kind, const ParamInfo& param) const {
  if (param.ndim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': ", kind,
                                                   " needs a 2-D parameter, got shape ",
                                                   ShapeString(param.shape)));
  }
  if (config_.split_qkv && param.qkv.num_query_groups > 0) {
    const int64_t group = GroupRows(param.qkv);
    if (group == 0 || param.shape[0] % group != 0) {
      return absl::InvalidArgumentError(absl::StrCat("param '", param.name, "': qkv split of ",
                                                     group, " rows per query group does not ",
                                                     "divide its ", param.shape[0], " rows"));
    }
  }
  return absl::OkStatus();
}

absl::Status MuonCore::InitState(Device& device, const ParamInfo& param, ParamState& state) const {
  OPTSTEP_ASSIGN_OR_RETURN(Tensor buffer, device.Allocate(DType::kF32, param.shape));
  state.tensors.emplace_back("momentum_buffer", std::move(buffer));
  state.qkv = param.qkv;
  return absl::OkStatus();
}

absl::Status MuonCore::OrthogonalizeOne(Device& device, const Tensor& u, Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(ns_.Run(device, u, out));
  const double s = MuonScaleFactor(scale_mode_, u.dim(0), u.dim(1)) * config_.extra_scale_factor;
  return device.Scale(static_cast<float>(s), out);
}

absl::StatusOr<Tensor> MuonCore::Orthogonalized(Device& device, const StepArgs& args,
                                                const Tensor& grad, Tensor& param,
                                                ParamState& state) {
  Tensor* momentum = state.Find("momentum_buffer");
  if (momentum == nullptr) return absl::InternalError("muon: state is missing momentum_buffer");
  const Shape& shape = param.shape();
  OPTSTEP_ASSIGN_OR_RETURN(Tensor u, workspace_.Get(device, kUpdate, DType::kF32, shape));
  const math::MuonMomentumArgs a = math::MakeMuonMomentumArgs(
      config_.momentum, config_.nesterov, config_.weight_decay_mode, args.lr, args.weight_decay);
  OPTSTEP_RETURN_IF_ERROR(device.updates().MuonMomentum(a, grad, param, *momentum, u));
  if (!config_.orthogonalize) return u;
  OPTSTEP_ASSIGN_OR_RETURN(Tensor o, workspace_.Get(device, kOrthogonal, DType::kF32, shape));
  if (!config_.split_qkv || state.qkv.num_query_groups == 0) {
    OPTSTEP_RETURN_IF_ERROR(OrthogonalizeOne(device, u, o));
    return o;
  }
  const int64_t group = GroupRows(state.qkv);
  const int64_t groups = shape[0] / group;
  for (const Component& comp : QkvComponents(state.qkv)) {
    const Shape part = {groups * comp.rows, shape[1]};
    OPTSTEP_ASSIGN_OR_RETURN(Tensor in, workspace_.Get(device, kComponentIn, DType::kF32, part));
    OPTSTEP_ASSIGN_OR_RETURN(Tensor out, workspace_.Get(device, kComponentOut, DType::kF32, part));
    // De-interleave the component's rows of every query group, orthogonalize, re-interleave.
    OPTSTEP_RETURN_IF_ERROR(device.matrix().CopyRowBlocks(
        {groups, comp.rows, comp.first_row, group, 0, comp.rows}, u, in));
    OPTSTEP_RETURN_IF_ERROR(OrthogonalizeOne(device, in, out));
    OPTSTEP_RETURN_IF_ERROR(device.matrix().CopyRowBlocks(
        {groups, comp.rows, 0, comp.rows, comp.first_row, group}, out, o));
  }
  return o;
}

void MuonCore::PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const {
  plan.Need(kUpdate, DType::kF32, param.shape);
  if (!config_.orthogonalize) return;
  plan.Need(kOrthogonal, DType::kF32, param.shape);
  if (!config_.split_qkv || param.qkv.num_query_groups == 0 || GroupRows(param.qkv) == 0) {
    ns_.PlanWorkspace(param.shape[0], param.shape[1], plan.Part(0));
    return;
  }
  const int64_t groups = param.shape[0] / GroupRows(param.qkv);
  for (const Component& comp : QkvComponents(param.qkv)) {
    const Shape part = {groups * comp.rows, param.shape[1]};
    plan.Need(kComponentIn, DType::kF32, part);
    plan.Need(kComponentOut, DType::kF32, part);
    ns_.PlanWorkspace(part[0], part[1], plan.Part(0));
  }
}

double MuonCore::EstimateStepCost(const ParamInfo& param) const {
  const int64_t rows = param.shape[0];
  const int64_t cols = param.shape[1];
  double flops = 0.0;
  if (config_.split_qkv && param.qkv.num_query_groups > 0 && GroupRows(param.qkv) > 0) {
    const int64_t groups = rows / GroupRows(param.qkv);
    for (const Component& comp : QkvComponents(param.qkv)) {
      flops += NewtonSchulz::Flops(groups * comp.rows, cols, config_.num_ns_steps);
    }
  } else {
    flops = NewtonSchulz::Flops(rows, cols, config_.num_ns_steps);
  }
  return kElementwiseBytes * static_cast<double>(param.numel()) + flops / Optimizer::kFlopsPerByte;
}

}  // namespace optstep
