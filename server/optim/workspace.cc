#include "server/optim/workspace.h"

#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<Tensor> Workspace::Get(Device& device, int slot, DType dtype, const Shape& shape) {
  if (slot >= static_cast<int>(buffers_.size())) buffers_.resize(slot + 1);
  Tensor& buffer = buffers_[slot];
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
  if (!buffer.defined() || static_cast<int64_t>(buffer.bytes()) < bytes) {
    buffer = Tensor();  // release first: the peak is the new size, not old + new
    OPTSTEP_ASSIGN_OR_RETURN(buffer, device.Allocate(DType::kF32, {(bytes + 3) / 4}));
  }
  return Tensor(dtype, shape, buffer.data(), Tensor::Deleter());
}

int64_t Workspace::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : buffers_) total += static_cast<int64_t>(t.bytes());
  return total;
}

}  // namespace optstep
