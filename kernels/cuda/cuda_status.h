#ifndef OPTSTEP_KERNELS_CUDA_CUDA_STATUS_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_STATUS_H_

// Translates the CUDA runtime's error domain into absl::Status at the call site:
//
//   OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream));
//
// returns INTERNAL ("cudaMemcpyAsync(...) failed: cudaErrorIllegalAddress: an illegal memory
// access was encountered [kernels/cuda/cuda_device.cc:120]") from the enclosing function.
// Arguments are validated on the host before any launch, so an error reported by CUDA is never
// the client's fault: INTERNAL. (A sticky error leaves the context unusable; the server marks
// itself NOT_SERVING and exits.) Only kernels/cuda includes this header.

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace internal {

inline absl::Status CudaErrorToStatus(cudaError_t error, const char* expr, const char* file,
                                      int line) {
  return absl::InternalError(absl::StrCat(expr, " failed: ", cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error), " [", file, ":", line, "]"));
}

}  // namespace internal
}  // namespace optstep

#define OPTSTEP_CUDA_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                    \
    const cudaError_t optstep_cuda_error_ = (expr);                                       \
    if (optstep_cuda_error_ != cudaSuccess) {                                             \
      return ::optstep::internal::CudaErrorToStatus(optstep_cuda_error_, #expr, __FILE__, \
                                                    __LINE__);                            \
    }                                                                                     \
  } while (0)

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_STATUS_H_
