#ifndef OPTSTEP_CHECKPOINT_LAYOUT_H_
#define OPTSTEP_CHECKPOINT_LAYOUT_H_

// The placement of a session's parameters over its ranks, as the engine runs it and as a
// checkpoint's manifest records it. A plain value; the partitioners that compute one are in
// checkpoint/partition.h.

#include <vector>

namespace optstep {

// Which rank owns which parameter (layer-wise partition: whole parameters).
struct Layout {
  int world_size = 1;
  std::vector<int> owner;  // owner[param_id]
};

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_LAYOUT_H_
