#ifndef OPTSTEP_CLIENT_CPP_PROTO_DTYPE_H_
#define OPTSTEP_CLIENT_CPP_PROTO_DTYPE_H_

// optstep::DType <-> optstep.v1.DType for the client. (Named apart from the server's helpers so
// that a test binary may link both.)

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "optstep/v1/tensor.pb.h"

namespace optstep {
namespace client_internal {

v1::DType ToWireDType(DType dtype);

// INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> FromWireDType(v1::DType dtype);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_PROTO_DTYPE_H_
