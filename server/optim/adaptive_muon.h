#ifndef OPTSTEP_SERVER_OPTIM_ADAPTIVE_MUON_H_
#define OPTSTEP_SERVER_OPTIM_ADAPTIVE_MUON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/muon_core.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/workspace.h"

namespace optstep {

// AdaptiveMuon (spec §3.5, Emerging-Optimizers v0.2.0): Muon's O = NS(u)·s·κ (the scale applied
// once, inside orthogonalization), then a second moment without bias correction:
//   adamuon  v ← β2·v + (1−β2)·O²,  p ← p − η·O/(√v + ε)                (v: shape of p)
//   normuon  v ← β2·v + (1−β2)·mean(O²) over the last axis when m ≥ n (v: (m,1)), else over the
//            first (v: (1,n)); p ← p − η·O/√max(v, ε)
// State per parameter: "momentum_buffer", "moment2_buffer". Only 2-D parameters.
// Thread-compatible.
class AdaptiveMuon final : public Optimizer {
 public:
  enum class Method { kAdamuon, kNormuon };

  // INVALID_ARGUMENT naming `owner`: the Muon checks, unknown moment2_method, β2 ∉ [0, 1),
  // ε < 0.
  static absl::StatusOr<std::unique_ptr<AdaptiveMuon>> Create(const std::string& owner,
                                                              const AdaptiveMuonConfig& config);

  std::string kind() const override { return "adaptive_muon"; }
  double default_lr() const override { return config_.muon.lr; }
  double default_weight_decay() const override { return config_.muon.weight_decay; }
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  double EstimateStepCost(const ParamInfo& param) const override;

  // The shape of normuon's moment for an m×n parameter: (m, 1) if m ≥ n, else (1, n).
  static Shape NormuonMomentShape(const Shape& param_shape);

 private:
  AdaptiveMuon(const AdaptiveMuonConfig& config, Method method, std::unique_ptr<MuonCore> core)
      : config_(config), method_(method), core_(std::move(core)) {}

  const AdaptiveMuonConfig config_;
  const Method method_;
  const std::unique_ptr<MuonCore> core_;
  Workspace workspace_;  // normuon's row/column sums and scales
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_ADAPTIVE_MUON_H_
