#ifndef OPTSTEP_WIRE_PROTO_DTYPE_H_
#define OPTSTEP_WIRE_PROTO_DTYPE_H_

// optstep::DType <-> optstep.v1.DType, for tensor chunks in either direction. Stateless;
// thread-safe.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "optstep/v1/tensor.pb.h"

namespace optstep {

// INVALID_ARGUMENT for DTYPE_UNSPECIFIED, DTYPE_INT64 (state dicts only) or an unknown value:
// "<what>: dtype <n> is not one of fp32, bf16, fp16". `what` names the chunk, e.g.
// "gradient chunk of param_id 3".
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view what);
v1::DType DTypeToProto(DType dtype);

}  // namespace optstep

#endif  // OPTSTEP_WIRE_PROTO_DTYPE_H_
