#ifndef OPTSTEP_SERVER_OPTIM_ADAMW_H_
#define OPTSTEP_SERVER_OPTIM_ADAMW_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/math/elementwise.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// Adam / AdamW (spec §3.1). State per parameter: "exp_avg", "exp_avg_sq" (shape of the
// parameter). The step counter t is the group's applied-step count (StepArgs::group_step).
class AdamW final : public Optimizer {
 public:
  // INVALID_ARGUMENT naming `owner` for values outside spec §3.1's ranges.
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(const std::string& owner,
                                                       const AdamWConfig& config);

  std::string kind() const override { return "adamw"; }
  double default_lr() const override { return config_.lr; }
  double default_weight_decay() const override { return config_.weight_decay; }
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  // One UpdateKernels::AdamWBatch for the whole batch.
  absl::Status StepBatch(Device& device, const StepArgs& args,
                         absl::Span<const StepOperands> batch) override;
  bool batches() const override { return true; }
  // The clip coefficient goes into the update (math::AdamWArgs::grad_scale).
  bool scales_gradient() const override { return true; }
  // 28 bytes per element: reads g, p, m, v and writes p, m, v.
  double EstimateStepCost(const ParamInfo& param) const override;

 private:
  explicit AdamW(const AdamWConfig& config) : config_(config) {}

  // The kernel's arguments of a step with `args`.
  math::AdamWArgs KernelArgs(const StepArgs& args) const;

  const AdamWConfig config_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_ADAMW_H_
