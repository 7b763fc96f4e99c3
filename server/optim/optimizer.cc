#include "server/optim/optimizer.h"

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

}  // namespace optstep
