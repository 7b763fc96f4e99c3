#include "server/optim/optimizer.h"

#include "base/status_macros.h"

namespace optstep {

Tensor* ParamState::Find(const std::string& key) {
  for (auto& [name, tensor] : tensors) {
    if (name == key) return &tensor;
  }
  return nullptr;
}

int64_t ParamState::bytes() const {
  int64_t total = 0;
  for (const auto& entry : tensors) total += static_cast<int64_t>(entry.second.bytes());
  return total;
}

absl::Status Optimizer::StepBatch(Device& device, const StepArgs& args,
                                  absl::Span<const StepOperands> batch) {
  for (const StepOperands& t : batch) {
    OPTSTEP_RETURN_IF_ERROR(Step(device, args, *t.grad, *t.param, *t.state));
  }
  return absl::OkStatus();
}

}  // namespace optstep
