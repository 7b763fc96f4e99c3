#ifndef OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_
#define OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace optstep {

// The parameters of a session as they were after one step, serialised once in one wire dtype and
// shared (read-only) by every stream that sends them. Immutable after construction.
struct ParamSnapshot {
  uint64_t step = 0;
  DType dtype = DType::kF32;
  std::vector<std::string> values;  // values[param_id]: raw little-endian bytes, whole tensor
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_
