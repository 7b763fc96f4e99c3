#include "kernels/comm/local_communicator.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/comm/comm_validation.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<LocalCommunicator>> LocalCommunicator::Create(
    const CommunicatorOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateCommunicatorOptions(options));
  if (options.world_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat("communicator '", options.kind,
                                                   "': a local communicator has world_size 1, "
                                                   "not ",
                                                   options.world_size));
  }
  return std::unique_ptr<LocalCommunicator>(new LocalCommunicator());
}

absl::Status LocalCommunicator::AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) {
  return internal::ValidateAllReduce(data, count, dtype, op);
}

absl::Status LocalCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                           const std::vector<int64_t>& recv_counts,
                                           CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(
      internal::ValidateAllGatherV(0, 1, send, send_count, recv, recv_counts, dtype).status());
  if (send_count > 0 && send != recv) {
    std::memmove(recv, send, static_cast<size_t>(send_count) * CommDTypeSize(dtype));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(void* data, int64_t count, CommDType dtype, int root) {
  return internal::ValidateBroadcast(data, count, dtype, root, 1);
}

absl::Status LocalCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                          int64_t recv_count, CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateRingShift(send, send_count, recv, recv_count, dtype));
  if (send_count != recv_count) {
    return absl::InvalidArgumentError(absl::StrCat("ring shift of one rank: sends ", send_count,
                                                   " elements but receives ", recv_count));
  }
  if (send_count > 0 && send != recv) {
    std::memmove(recv, send, static_cast<size_t>(send_count) * CommDTypeSize(dtype));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Barrier() { return absl::OkStatus(); }

}  // namespace optstep
