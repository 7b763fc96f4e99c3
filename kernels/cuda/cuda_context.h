#ifndef OPTSTEP_KERNELS_CUDA_CUDA_CONTEXT_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_CONTEXT_H_

#include <memory>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_libraries.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/elementwise_kernels.h"

namespace optstep {
namespace internal {

// What the CUDA device shares with its kernel objects (CudaUpdateKernels, CudaMatrixKernels): the
// device ordinal, the grid-stride limit, the one stream all work goes to, and the cuBLAS /
// cuSOLVER handles on that stream. Owned by the CudaDevice; the kernel objects point to it.
//
// Thread safety: immutable after construction; Activate() may be called from any thread.
struct CudaContext {
  // cudaSetDevice(ordinal) for the calling thread.
  absl::Status Activate() const;
  // The stream and grid-stride limit that every kernel launch of the device uses.
  gpu::Launch launch() const { return {stream->get(), max_blocks}; }

  int ordinal = 0;
  int max_blocks = 1;  // grid-stride limit: about one resident wave of 256-thread blocks
  std::shared_ptr<CudaStream> stream;
  // Declared after stream: destroyed before it.
  std::unique_ptr<MathLibraries> libs;
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_CONTEXT_H_
