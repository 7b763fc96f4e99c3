#include "server/optim/workspace.h"

#include <algorithm>

#include "base/status_macros.h"

namespace optstep {

namespace {

// Whole fp32 elements that hold `shape` of `dtype`.
int64_t SlotElements(DType dtype, const Shape& shape) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  return (bytes + 3) / 4;
}

}  // namespace

absl::StatusOr<Tensor> Workspace::Get(Device& device, int slot, DType dtype, const Shape& shape) {
  if (slot >= static_cast<int>(buffers_.size())) buffers_.resize(slot + 1);
  Tensor& buffer = buffers_[slot];
  const int64_t elements = SlotElements(dtype, shape);
  if (!buffer.defined() || static_cast<int64_t>(buffer.numel()) < elements) {
    buffer = Tensor();  // release first: the peak is the new size, not old + new
    OPTSTEP_ASSIGN_OR_RETURN(buffer, device.Allocate(DType::kF32, {elements}));
  }
  return Tensor(dtype, shape, buffer.data(), Tensor::Deleter());
}

int64_t Workspace::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : buffers_) total += static_cast<int64_t>(t.bytes());
  return total;
}

void WorkspacePlan::Need(int slot, DType dtype, const Shape& shape) {
  if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1, 0);
  slots_[slot] = std::max(slots_[slot], SlotElements(dtype, shape) * 4);
}

WorkspacePlan& WorkspacePlan::Part(int index) {
  if (index >= static_cast<int>(parts_.size())) parts_.resize(index + 1);
  if (parts_[index] == nullptr) parts_[index] = std::make_unique<WorkspacePlan>();
  return *parts_[index];
}

int64_t WorkspacePlan::bytes() const {
  int64_t total = 0;
  for (int64_t slot : slots_) total += slot;
  for (const auto& part : parts_) {
    if (part != nullptr) total += part->bytes();
  }
  return total;
}

}  // namespace optstep
