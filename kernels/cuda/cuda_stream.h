#ifndef OPTSTEP_KERNELS_CUDA_CUDA_STREAM_H_
#define OPTSTEP_KERNELS_CUDA_CUDA_STREAM_H_

// The CUDA device's stream and scratch memory in stream order, for the device's source files.
// Thread-compatible.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_status.h"

namespace optstep {
namespace internal {

// The device's stream, destroyed when the device and all of its tensors are gone.
class CudaStream {
 public:
  CudaStream(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() {
    if (cudaSetDevice(ordinal_) == cudaSuccess) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  cudaStream_t get() const { return stream_; }

 private:
  const int ordinal_;
  const cudaStream_t stream_;
};

// Device scratch memory in stream order (cudaMallocAsync / cudaFreeAsync on one stream), freed
// (in stream order) on destruction.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }
  // REQUIRES: called at most once.
  absl::Status Allocate(size_t bytes) {
    OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&data_, std::max<size_t>(bytes, 16), stream_));
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  const cudaStream_t stream_;
  void* data_ = nullptr;
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CUDA_CUDA_STREAM_H_
