#ifndef OPTSTEP_KERNELS_COMM_COMM_VALIDATION_H_
#define OPTSTEP_KERNELS_COMM_COMM_VALIDATION_H_

// Argument checks shared by every Communicator implementation, so that all of them answer the
// same codes with the same messages. Each runs on the host before any communication: a call
// that fails here has sent nothing and leaves the communicator usable (but the other ranks,
// which called the collective with their own arguments, will time out waiting for this one).
// Stateless; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/comm/communicator.h"

namespace optstep {
namespace internal {

// "float32", "float64", "uint8" (or "CommDType(7)").
std::string CommDTypeName(CommDType dtype);

// rank in [0, world_size), world_size >= 1, timeout > 0, a store where world_size > 1.
// INVALID_ARGUMENT otherwise.
absl::Status ValidateCommunicatorOptions(const CommunicatorOptions& options);

// count >= 0, data set when count > 0, dtype float32 or float64, op kSum or kMax.
absl::Status ValidateAllReduce(const void* data, int64_t count, CommDType dtype, ReduceOp op);

// Where each rank's block lies in an all-gather-v's receive buffer, in elements.
struct GatherLayout {
  std::vector<int64_t> offsets;  // offsets[r]: the first element of rank r's block
  int64_t total = 0;             // elements of the receive buffer
};

// recv_counts.size() == world_size, every count >= 0, send_count == recv_counts[rank], buffers
// set where their counts are > 0, the total byte size fits in int64. Answers the layout.
absl::StatusOr<GatherLayout> ValidateAllGatherV(int rank, int world_size, const void* send,
                                                int64_t send_count, const void* recv,
                                                const std::vector<int64_t>& recv_counts,
                                                CommDType dtype);

// count >= 0, data set when count > 0, a known dtype, root in [0, world_size).
// Both buffers of a ring shift (null only when empty).
absl::Status ValidateRingShift(const void* send, int64_t send_count, const void* recv,
                               int64_t recv_count, CommDType dtype);
absl::Status ValidateBroadcast(const void* data, int64_t count, CommDType dtype, int root,
                               int world_size);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_COMM_VALIDATION_H_
