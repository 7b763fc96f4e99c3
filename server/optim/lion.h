#ifndef OPTSTEP_SERVER_OPTIM_LION_H_
#define OPTSTEP_SERVER_OPTIM_LION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// Lion (spec §3.3): weight decay first (decoupled by default; independent, l2 and palm on
// request), c ← β1·m + (1−β1)·g, m ← β2·m + (1−β2)·g, p ← p − η·sign(c). Any parameter shape.
// State per parameter: "exp_avg" (shape of the parameter); no counter. Thread-compatible.
class Lion final : public Optimizer {
 public:
  // INVALID_ARGUMENT naming `owner`: lr < 0, betas ∉ [0, 1), weight_decay < 0, unknown mode.
  static absl::StatusOr<std::unique_ptr<Lion>> Create(const std::string& owner,
                                                      const LionConfig& config);

  std::string kind() const override { return "lion"; }
  double default_lr() const override { return config_.lr; }
  double default_weight_decay() const override { return config_.weight_decay; }
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  // The clip coefficient goes into the update (math::LionArgs::grad_scale).
  bool scales_gradient() const override { return true; }
  // 20 bytes per element: reads g, p, m and writes p, m.
  double EstimateStepCost(const ParamInfo& param) const override;

 private:
  explicit Lion(const LionConfig& config) : config_(config) {}

  const LionConfig config_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_LION_H_
