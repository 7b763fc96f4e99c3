#ifndef OPTSTEP_CLIENT_CPP_CLIENT_TYPES_H_
#define OPTSTEP_CLIENT_CPP_CLIENT_TYPES_H_

// Plain data that crosses optstep::Client's API: gradients in, step results and parameters out.
// No gRPC types. Element types are optstep::DType (kernels/dtype.h) throughout.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace optstep {

// A contiguous range of one parameter's gradient: count = bytes.size() / DTypeSize(dtype)
// elements (row-major, flat) starting at element `offset`, as raw little-endian bytes. Any size:
// the client splits it into wire chunks. Does not own `bytes`, which must outlive the call.
struct GradientSlice {
  uint32_t param_id = 0;
  uint64_t offset = 0;
  DType dtype = DType::kF32;
  absl::Span<const uint8_t> bytes;
};

// The whole fp32 gradient of one parameter (values.size() == the parameter's element count).
// Does not own `values`.
struct FullGradient {
  uint32_t param_id = 0;
  absl::Span<const float> values;
};

// This step's schedule values for one hyperparameter group (SessionInfo.groups[].id). Unset
// values keep the group's defaults.
struct GroupSchedule {
  uint32_t group_id = 0;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

struct StepOptions {
  std::string session_id;
  // 1-based number of the step to apply: SessionInfo.step + 1.
  uint64_t step = 0;
  uint32_t trainer_id = 0;  // 0 .. num_trainers-1
  std::vector<GroupSchedule> groups;
  // Element type of the returned parameters: kF32 or kBF16.
  DType return_dtype = DType::kF32;
  // Parameters to return after the step; empty means all of them.
  std::vector<uint32_t> return_param_ids;
  // true: return no parameters (StepReply.params stays empty).
  bool skip_return = false;
};

// One parameter's values on the host, complete (all of its elements). Exactly one of `f32` and
// `bf16` is filled, according to `dtype`.
struct HostParameter {
  uint32_t param_id = 0;
  DType dtype = DType::kF32;
  std::vector<float> f32;      // dtype == kF32
  std::vector<uint16_t> bf16;  // dtype == kBF16: raw bfloat16 bits
  // Number of elements, whichever the dtype.
  size_t size() const { return dtype == DType::kF32 ? f32.size() : bf16.size(); }
};

// Parameters keyed (and ordered) by param id.
using HostParameterMap = std::map<uint32_t, HostParameter>;

// Where returned parameters are written instead of StepReply.params, by param id: the caller's
// memory for every element of the parameter in the return dtype (e.g. the model's own tensor).
// Does not own the memory.
using ParamDestinations = std::map<uint32_t, absl::Span<uint8_t>>;

struct StepReply {
  uint64_t step = 0;       // the step just applied (or skipped)
  bool skipped = false;    // non-finite gradients: nothing changed
  double grad_norm = 0.0;  // pre-clip global L2 norm; 0 when skipped
  bool clipped = false;
  HostParameterMap params;  // empty when StepOptions.skip_return
  // Parameters written into their ParamDestinations (and so not in `params`).
  uint32_t destinations_filled = 0;
};

struct Parameters {
  uint64_t step = 0;  // the step the values belong to
  HostParameterMap params;
  // Parameters written into their ParamDestinations (and so not in `params`).
  uint32_t destinations_filled = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CLIENT_TYPES_H_
