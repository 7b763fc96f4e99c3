#ifndef OPTSTEP_KERNELS_COMM_NCCL_STATUS_H_
#define OPTSTEP_KERNELS_COMM_NCCL_STATUS_H_

// Translates NCCL's error domain into absl::Status at the call site:
//
//   OPTSTEP_NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, count, type, op, comm, stream));
//
// returns from the enclosing function, for a result other than ncclSuccess and ncclInProgress
// (a non-blocking communicator's "still being enqueued / initialised": the caller then polls
// ncclCommGetAsyncError), UNAVAILABLE for ncclSystemError and ncclRemoteError (a peer or the
// network failed) and INTERNAL for the rest (arguments were validated before the call, so
// NCCL's complaint is never the caller's fault). Only kernels/comm's NCCL files include this.

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace internal {

inline absl::StatusCode NcclResultCode(ncclResult_t result) {
  return result == ncclSystemError || result == ncclRemoteError ? absl::StatusCode::kUnavailable
                                                                : absl::StatusCode::kInternal;
}

inline absl::Status NcclErrorToStatus(ncclResult_t result, const char* expr, const char* file,
                                      int line) {
  return absl::Status(
      NcclResultCode(result),
      absl::StrCat(expr, " failed: ", ncclGetErrorString(result), " [", file, ":", line, "]"));
}

}  // namespace internal
}  // namespace optstep

#define OPTSTEP_NCCL_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                     \
    const ncclResult_t optstep_nccl_result_ = (expr);                                      \
    if (optstep_nccl_result_ != ncclSuccess && optstep_nccl_result_ != ncclInProgress) {   \
      return ::optstep::internal::NcclErrorToStatus(optstep_nccl_result_, #expr, __FILE__, \
                                                    __LINE__);                             \
    }                                                                                      \
  } while (0)

#endif  // OPTSTEP_KERNELS_COMM_NCCL_STATUS_H_
