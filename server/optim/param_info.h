#ifndef OPTSTEP_SERVER_OPTIM_PARAM_INFO_H_
#define OPTSTEP_SERVER_OPTIM_PARAM_INFO_H_

#include <cstdint>
#include <string>

#include "kernels/tensor.h"

namespace optstep {

// Q/K/V split of a fused attention projection (spec §3.4.6).
struct QkvSplitInfo {
  uint32_t num_query_groups = 0;  // 0: not a fused QKV parameter
  uint32_t q_per_group = 0;
  uint32_t head_dim = 0;
};

// What the optimizer layer knows about a parameter: enough to route and validate it.
struct ParamInfo {
  std::string name;
  Shape shape;
  uint32_t model_chunk = 0;
  bool embedding_or_output = false;
  bool expert = false;
  QkvSplitInfo qkv;

  int64_t numel() const { return NumElements(shape); }
  int ndim() const { return static_cast<int>(shape.size()); }
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_PARAM_INFO_H_
