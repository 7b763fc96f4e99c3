#ifndef OPTSTEP_KERNELS_COMM_LOCAL_COMMUNICATOR_H_
#define OPTSTEP_KERNELS_COMM_LOCAL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/comm/communicator.h"

namespace optstep {

// The communicator of a group of one rank (kind "local"; also what "gloo" creates for
// world_size 1): every collective validates its arguments like the others do and then is a
// no-op, except AllGatherV, which copies `send` into `recv` unless it is already in place.
// Buffers are host memory. Thread-compatible (stateless apart from its rank and size).
class LocalCommunicator final : public Communicator {
 public:
  // INVALID_ARGUMENT unless options.world_size == 1 and options.rank == 0. Needs no store.
  static absl::StatusOr<std::unique_ptr<LocalCommunicator>> Create(
      const CommunicatorOptions& options);

  LocalCommunicator(const LocalCommunicator&) = delete;
  LocalCommunicator& operator=(const LocalCommunicator&) = delete;

  int rank() const override { return 0; }
  int world_size() const override { return 1; }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  absl::Status Barrier() override;

 private:
  LocalCommunicator() = default;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_LOCAL_COMMUNICATOR_H_
