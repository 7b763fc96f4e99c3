#include "kernels/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "kernels/comm/comm_validation.h"
#include "kernels/comm/nccl_status.h"
#include "kernels/cuda/cuda_status.h"

namespace optstep {
namespace internal {

// Polls the first few times without sleeping (a small collective completes in microseconds),
// then sleeps, so that a long wait does not spin a core.
class Poller {
 public:
  void Wait() {
    if (++polls_ <= kSpins) {
      std::this_thread::yield();
      return;
    }
    absl::SleepFor(sleep_);
    sleep_ = std::min(sleep_ * 2, absl::Milliseconds(1));
  }

 private:
  static constexpr int kSpins = 2000;
  int polls_ = 0;
  absl::Duration sleep_ = absl::Microseconds(20);
};

struct NcclHandles {
  int ordinal = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float on the device, for Barrier

  NcclHandles() = default;
  NcclHandles(const NcclHandles&) = delete;
  NcclHandles& operator=(const NcclHandles&) = delete;

  ~NcclHandles() {
    cudaSetDevice(ordinal);
    Abort();
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (scratch != nullptr) cudaFree(scratch);
  }

  // Frees the NCCL communicator at once, without waiting for anything.
  void Abort() {
    if (comm == nullptr) return;
    const ncclResult_t result = ncclCommAbort(comm);
    LOG_IF(WARNING, result != ncclSuccess && result != ncclInProgress)
        << "ncclCommAbort: " << ncclGetErrorString(result);
    comm = nullptr;
  }

  // Until the communicator leaves ncclInProgress (initialisation, enqueueing, finalisation):
  // OK, its error, or DEADLINE_EXCEEDED at `deadline`.
  absl::Status WaitForComm(absl::string_view what, absl::Time deadline) const {
    Poller poller;
    while (true) {
      ncclResult_t state = ncclSuccess;
      OPTSTEP_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return AsyncError(what, state);
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL did not complete in time"));
      }
      poller.Wait();
    }
  }

  // Until the work enqueued on `stream` completes: OK, an error of the communicator or of
  // CUDA, or DEADLINE_EXCEEDED at `deadline`.
  absl::Status WaitForStream(absl::string_view what, absl::Time deadline) const {
    Poller poller;
    while (true) {
      ncclResult_t state = ncclSuccess;
      OPTSTEP_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
      if (state != ncclSuccess && state != ncclInProgress) return AsyncError(what, state);
      const cudaError_t query = cudaStreamQuery(stream);
      if (query == cudaSuccess && state == ncclSuccess) return absl::OkStatus();
      if (query != cudaSuccess && query != cudaErrorNotReady) {
        return CudaErrorToStatus(query, "cudaStreamQuery", __FILE__, __LINE__);
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": did not complete within the timeout"));
      }
      poller.Wait();
    }
  }

  absl::Status AsyncError(absl::string_view what, ncclResult_t state) const {
    return absl::Status(NcclResultCode(state), absl::StrCat(what, ": ", ncclGetErrorString(state),
                                                            ": ", ncclGetLastError(comm)));
  }
};

namespace {

ncclDataType_t NcclType(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return ncclFloat32;
    case CommDType::kFloat64:
      return ncclFloat64;
    case CommDType::kUint8:
      return ncclUint8;
  }
  LOG(FATAL) << "unvalidated CommDType " << static_cast<int>(dtype);
  return ncclUint8;
}

// The unique id from rank 0, through the store.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const CommunicatorOptions& options) {
  ncclUniqueId id;
  const std::string key = absl::StrCat(options.prefix, "/nccl/unique_id");
  if (options.rank == 0) {
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (options.store != nullptr) {
      OPTSTEP_RETURN_IF_ERROR(
          options.store->Set(key, std::string(id.internal, sizeof(id.internal))));
    }
    return id;
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::string value, options.store->Get(key, options.timeout));
  if (value.size() != sizeof(id.internal)) {
    return absl::InternalError(absl::StrCat("store key '", key, "' holds ", value.size(),
                                            " bytes; an NCCL unique id has ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, value.data(), sizeof(id.internal));
  return id;
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const CommunicatorOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateCommunicatorOptions(options));
  const std::string what = absl::StrCat("nccl communicator '", options.prefix, "' rank ",
                                        options.rank, " of ", options.world_size);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(what, ": no CUDA device is available"));
  }
  if (options.device_ordinal < 0 || options.device_ordinal >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": device ordinal ", options.device_ordinal, " is outside [0, ", devices, ")"));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device_ordinal));
  OPTSTEP_ASSIGN_OR_RETURN(ncclUniqueId id, internal::ExchangeUniqueId(options));

  auto handles = std::make_unique<internal::NcclHandles>();
  handles->ordinal = options.device_ordinal;
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&handles->stream, cudaStreamNonBlocking));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMalloc(&handles->scratch, sizeof(float)));
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaMemset(handles->scratch, 0, sizeof(float)));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that initialisation and collectives can time out
  OPTSTEP_NCCL_RETURN_IF_ERROR(
      ncclCommInitRankConfig(&handles->comm, options.world_size, id, options.rank, &config));
  // On error, `handles` aborts the half-initialised communicator.
  OPTSTEP_RETURN_IF_ERROR(handles->WaitForComm(absl::StrCat(what, ": init"), deadline));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(options.rank, options.world_size, options.prefix, options.device_ordinal,
                           options.timeout, std::move(handles)));
}

NcclCommunicator::NcclCommunicator(int rank, int world_size, std::string prefix, int ordinal,
                                   absl::Duration timeout,
                                   std::unique_ptr<internal::NcclHandles> handles)
    : rank_(rank),
      world_size_(world_size),
      prefix_(std::move(prefix)),
      ordinal_(ordinal),
      timeout_(timeout),
      handles_(std::move(handles)) {}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(ordinal_);
  if (!broken_.ok() || handles_->comm == nullptr) return;  // ~NcclHandles aborts it
  const ncclResult_t finalize = ncclCommFinalize(handles_->comm);
  if ((finalize == ncclSuccess || finalize == ncclInProgress) &&
      handles_->WaitForComm(Describe(), absl::Now() + timeout_).ok()) {
    const ncclResult_t result = ncclCommDestroy(handles_->comm);
    LOG_IF(WARNING, result != ncclSuccess) << "ncclCommDestroy: " << ncclGetErrorString(result);
    handles_->comm = nullptr;
  }
  // Otherwise (finalisation failed or did not complete in time) ~NcclHandles aborts it.
}

std::string NcclCommunicator::Describe() const {
  return absl::StrCat("nccl communicator '", prefix_, "' rank ", rank_, " of ", world_size_);
}

absl::Status NcclCommunicator::Begin() {
  if (!broken_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        Describe(),
        ": unusable after an earlier error (the group must be re-created): ", broken_.message()));
  }
  OPTSTEP_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::Finish(absl::string_view op, absl::Status enqueued) {
  const std::string what = absl::StrCat(Describe(), ": ", op);
  const absl::Time deadline = absl::Now() + timeout_;
  absl::Status status =
      enqueued.ok() ? handles_->WaitForComm(what, deadline)
                    : absl::Status(enqueued.code(), absl::StrCat(what, ": ", enqueued.message()));
  if (status.ok()) status = handles_->WaitForStream(what, deadline);
  if (!status.ok()) {
    broken_ = status;
    handles_->Abort();
  }
  return status;
}

absl::Status NcclCommunicator::AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) {
  OPTSTEP_RETURN_IF_ERROR(Begin());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateAllReduce(data, count, dtype, op));
  if (count == 0) return absl::OkStatus();
  auto enqueue = [&]() -> absl::Status {
    OPTSTEP_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(data, data, static_cast<size_t>(count), internal::NcclType(dtype),
                      op == ReduceOp::kSum ? ncclSum : ncclMax, handles_->comm, handles_->stream));
    return absl::OkStatus();
  };
  return Finish("all-reduce", enqueue());
}

absl::Status NcclCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                          const std::vector<int64_t>& recv_counts,
                                          CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(Begin());
  OPTSTEP_ASSIGN_OR_RETURN(
      const internal::GatherLayout layout,
      internal::ValidateAllGatherV(rank_, world_size_, send, send_count, recv, recv_counts, dtype));
  if (layout.total == 0) return absl::OkStatus();
  const size_t element_size = CommDTypeSize(dtype);
  uint8_t* out = static_cast<uint8_t*>(recv);
  auto enqueue = [&]() -> absl::Status {
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int r = 0; r < world_size_; ++r) {
      if (recv_counts[r] == 0) continue;
      uint8_t* block = out + layout.offsets[r] * element_size;
      const void* source = r == rank_ ? send : block;  // read on the root only
      const ncclResult_t result =
          ncclBroadcast(source, block, static_cast<size_t>(recv_counts[r]) * element_size,
                        ncclUint8, r, handles_->comm, handles_->stream);
      if (result != ncclSuccess && result != ncclInProgress) {
        ncclGroupEnd();
        return internal::NcclErrorToStatus(result, "ncclBroadcast", __FILE__, __LINE__);
      }
    }
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return absl::OkStatus();
  };
  return Finish("all-gather-v", enqueue());
}

absl::Status NcclCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                         int64_t recv_count, CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(Begin());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateRingShift(send, send_count, recv, recv_count, dtype));
  const size_t element_size = CommDTypeSize(dtype);
  const int next = (rank_ + 1) % world_size_;
  const int previous = (rank_ + world_size_ - 1) % world_size_;
  auto enqueue = [&]() -> absl::Status {
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    ncclResult_t result = ncclSuccess;
    if (send_count > 0) {
      result = ncclSend(send, static_cast<size_t>(send_count) * element_size, ncclUint8, next,
                        handles_->comm, handles_->stream);
    }
    if ((result == ncclSuccess || result == ncclInProgress) && recv_count > 0) {
      result = ncclRecv(recv, static_cast<size_t>(recv_count) * element_size, ncclUint8, previous,
                        handles_->comm, handles_->stream);
    }
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      return internal::NcclErrorToStatus(result, "ncclSend/ncclRecv", __FILE__, __LINE__);
    }
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return absl::OkStatus();
  };
  return Finish("ring shift", enqueue());
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t count, CommDType dtype, int root) {
  OPTSTEP_RETURN_IF_ERROR(Begin());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateBroadcast(data, count, dtype, root, world_size_));
  if (count == 0) return absl::OkStatus();
  auto enqueue = [&]() -> absl::Status {
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclBroadcast(data, data, static_cast<size_t>(count),
                                               internal::NcclType(dtype), root, handles_->comm,
                                               handles_->stream));
    return absl::OkStatus();
  };
  return Finish("broadcast", enqueue());
}

absl::Status NcclCommunicator::Barrier() {
  OPTSTEP_RETURN_IF_ERROR(Begin());
  auto enqueue = [&]() -> absl::Status {
    OPTSTEP_NCCL_RETURN_IF_ERROR(ncclAllReduce(handles_->scratch, handles_->scratch, 1, ncclFloat32,
                                               ncclSum, handles_->comm, handles_->stream));
    return absl::OkStatus();
  };
  return Finish("barrier", enqueue());
}

}  // namespace optstep
