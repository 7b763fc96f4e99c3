#ifndef OPTSTEP_SERVER_OPTIM_MUON_H_
#define OPTSTEP_SERVER_OPTIM_MUON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/muon_core.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// Muon (spec §3.4): weight decay (decoupled unless configured otherwise), EMA momentum,
// O = NS(u)·s·κ (muon_core.h), p ← p − η·O. Only 2-D parameters. State per parameter:
// "momentum_buffer" (shape of the parameter); no counter. Thread-compatible.
class Muon final : public Optimizer {
 public:
  // INVALID_ARGUMENT naming `owner` (see MuonCore::Create).
  static absl::StatusOr<std::unique_ptr<Muon>> Create(const std::string& owner,
                                                      const MuonConfig& config);

  std::string kind() const override { return "muon"; }
  double default_lr() const override { return core_->config().lr; }
  double default_weight_decay() const override { return core_->config().weight_decay; }
  absl::Status CheckParam(const ParamInfo& param) const override;
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override;
  int64_t StateBytes(const ParamInfo& param) const override;
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override;
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override;
  double EstimateStepCost(const ParamInfo& param) const override;

 private:
  explicit Muon(std::unique_ptr<MuonCore> core) : core_(std::move(core)) {}

  const std::unique_ptr<MuonCore> core_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_MUON_H_
