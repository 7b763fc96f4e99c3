#ifndef OPTSTEP_KERNELS_CUDA_CUDA_LIBRARIES_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_LIBRARIES_H_

// cuBLAS and cuSOLVER for the CUDA device: their error domains translated at the call site,
//
//   OPTSTEP_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(...));      // INTERNAL "cublasGemmEx(...) failed:
//   OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSsyevd(...));  //  CUBLAS_STATUS_... [file:line]"
//
// and the handles of one device, bound to its stream. Only kernels/cuda includes this header.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace optstep {
namespace internal {

absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line);
absl::Status CusolverErrorToStatus(cusolverStatus_t status, const char* expr, const char* file,
                                   int line);

// A cuBLAS and a cuSOLVER handle on one stream of one device. Thread-compatible (the device's
// worker serialises every call); destroyed with the device.
class MathLibraries {
 public:
  // REQUIRES: the device that owns `stream` is current on the calling thread.
  static absl::StatusOr<std::unique_ptr<MathLibraries>> Create(cudaStream_t stream);
  ~MathLibraries();
  MathLibraries(const MathLibraries&) = delete;
  MathLibraries& operator=(const MathLibraries&) = delete;

  cublasHandle_t cublas() const { return cublas_; }
  cusolverDnHandle_t cusolver() const { return cusolver_; }

 private:
  MathLibraries() = default;

  cublasHandle_t cublas_ = nullptr;
  cusolverDnHandle_t cusolver_ = nullptr;
};

}  // namespace internal
}  // namespace optstep

#define OPTSTEP_CUBLAS_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                         \
    const cublasStatus_t optstep_cublas_status_ = (expr);                                      \
    if (optstep_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                     \
      return ::optstep::internal::CublasErrorToStatus(optstep_cublas_status_, #expr, __FILE__, \
                                                      __LINE__);                               \
    }                                                                                          \
  } while (0)

#define OPTSTEP_CUSOLVER_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                             \
    const cusolverStatus_t optstep_cusolver_status_ = (expr);                                      \
    if (optstep_cusolver_status_ != CUSOLVER_STATUS_SUCCESS) {                                     \
      return ::optstep::internal::CusolverErrorToStatus(optstep_cusolver_status_, #expr, __FILE__, \
                                                        __LINE__);                                 \
    }                                                                                              \
  } while (0)

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_LIBRARIES_H_
