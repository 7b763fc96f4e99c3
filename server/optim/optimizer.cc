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

std::vector<int> BatchLengths(absl::Span<const int64_t> bytes, int64_t batch_bytes) {
  std::vector<int> lengths;
  int64_t held = 0;  // bytes of the last run
  for (int64_t b : bytes) {
    if (lengths.empty() || held + b > batch_bytes) {
      lengths.push_back(0);
      held = 0;
    }
    ++lengths.back();
    held += b;
  }
  return lengths;
}

}  // namespace optstep
