#ifndef OPTSTEP_SERVER_ENGINE_FINITE_VALUES_H_
#define OPTSTEP_SERVER_ENGINE_FINITE_VALUES_H_

// The check that values sent from outside (a parameter's initial values) are finite before any
// of them is written.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"

namespace optstep {

// OK when the `count` elements of `dtype` at `data` are all finite; otherwise INVALID_ARGUMENT
// "<owner>: <what> at element <offset + i> is <value>" for the first element i that is not.
absl::Status CheckFiniteValues(absl::string_view owner, absl::string_view what, int64_t offset,
                               DType dtype, const void* data, int64_t count);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_FINITE_VALUES_H_
