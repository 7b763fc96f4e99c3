#ifndef OPTSTEP_SERVER_OPTIM_SGD_H_
#define OPTSTEP_SERVER_OPTIM_SGD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// SGD with momentum and optional Nesterov (spec §3.2). Weight decay is coupled (L2). State per
// parameter: "momentum_buffer" when momentum > 0; the group's first applied step sets b <- d.
class Sgd final : public Optimizer {
 public:
  // INVALID_ARGUMENT naming `owner`: negative lr/momentum/weight_decay, Nesterov without momentum.
  static absl::StatusOr<std::unique_ptr<Sgd>> Create(const std::string& owner,
                                                     const SgdConfig& config);

  std::string kind() const override { return "sgd"; }
  double default_lr() const override { return config_.lr; }
  double default_weight_decay() const override { return config_.weight_decay; }
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  // The clip coefficient goes into the update (math::SgdArgs::grad_scale).
  bool scales_gradient() const override { return true; }
  // Bytes per element: 20 with momentum (reads g, p, b; writes p, b), 12 without.
  double EstimateStepCost(const ParamInfo& param) const override;

 private:
  explicit Sgd(const SgdConfig& config) : config_(config) {}

  const SgdConfig config_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_SGD_H_
