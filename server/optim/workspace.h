#ifndef OPTSTEP_SERVER_OPTIM_WORKSPACE_H_
#define OPTSTEP_SERVER_OPTIM_WORKSPACE_H_

#include <cstdint>
#include <memory>
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

// The bytes a Workspace will hold, planned before anything is allocated: Need mirrors Get (a
// slot keeps the largest buffer asked of it, rounded up to whole fp32 elements), so that after
// Need for every shape a workspace will be asked for, bytes() is what it holds at most. An
// object that owns several workspaces plans the ones of its parts with Part(i).
//
// Thread-compatible.
class WorkspacePlan {
 public:
  WorkspacePlan() = default;
  WorkspacePlan(const WorkspacePlan&) = delete;
  WorkspacePlan& operator=(const WorkspacePlan&) = delete;

  // As Workspace::Get(device, slot, dtype, shape) would allocate. REQUIRES: slot >= 0.
  void Need(int slot, DType dtype, const Shape& shape);
  // The plan of the workspace of part `index` (>= 0) of this plan's owner.
  WorkspacePlan& Part(int index);

  // Bytes of every slot, and of every part.
  int64_t bytes() const;

 private:
  std::vector<int64_t> slots_;                         // bytes by slot
  std::vector<std::unique_ptr<WorkspacePlan>> parts_;  // by index; null until asked
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_WORKSPACE_H_
