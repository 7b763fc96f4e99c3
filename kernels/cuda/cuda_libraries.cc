#include "kernels/cuda/cuda_libraries.h"

#include "absl/strings/str_cat.h"

namespace optstep {
namespace internal {

absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line) {
  return absl::InternalError(absl::StrCat(expr, " failed: ", cublasGetStatusName(status), ": ",
                                          cublasGetStatusString(status), " [", file, ":", line,
                                          "]"));
}

absl::Status CusolverErrorToStatus(cusolverStatus_t status, const char* expr, const char* file,
                                   int line) {
  return absl::InternalError(absl::StrCat(expr, " failed: cusolverStatus ",
                                          static_cast<int>(status), " [", file, ":", line, "]"));
}

absl::StatusOr<std::unique_ptr<MathLibraries>> MathLibraries::Create(cudaStream_t stream) {
  std::unique_ptr<MathLibraries> libs(new MathLibraries());
  OPTSTEP_CUBLAS_RETURN_IF_ERROR(cublasCreate(&libs->cublas_));
  OPTSTEP_CUBLAS_RETURN_IF_ERROR(cublasSetStream(libs->cublas_, stream));
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnCreate(&libs->cusolver_));
  OPTSTEP_CUSOLVER_RETURN_IF_ERROR(cusolverDnSetStream(libs->cusolver_, stream));
  return libs;
}

MathLibraries::~MathLibraries() {
  if (cusolver_ != nullptr) cusolverDnDestroy(cusolver_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

}  // namespace internal
}  // namespace optstep
