#ifndef OPTSTEP_SERVER_OPTIM_WORKSPACE_H_
#define OPTSTEP_SERVER_OPTIM_WORKSPACE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace optstep {

// Scratch tensors of one optimizer on one device, reused across parameters and steps: slot `i`
// keeps the largest buffer asked of it, and Get hands out views of it with the shape asked.
// The memory counts in the device's allocated_bytes (not in any parameter's state).
//
// Thread-compatible (the device worker makes every call). A view stays valid until the next Get
// of the same slot; views of different slots never overlap.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&&) = default;
  Workspace& operator=(Workspace&&) = default;

  // A view of `dtype` and `shape` on slot `slot` (>= 0). It holds what was last written to the
  // slot when the slot's buffer is large enough (no reallocation); otherwise unspecified values.
  // RESOURCE_EXHAUSTED when a larger buffer cannot be allocated.
  absl::StatusOr<Tensor> Get(Device& device, int slot, DType dtype, const Shape& shape);

  // Bytes held by all slots.
  int64_t bytes() const;

 private:
  std::vector<Tensor> buffers_;  // by slot; fp32 elements, rounded up
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_WORKSPACE_H_
