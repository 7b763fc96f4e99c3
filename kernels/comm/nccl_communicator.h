#ifndef OPTSTEP_KERNELS_COMM_NCCL_COMMUNICATOR_H_
#define OPTSTEP_KERNELS_COMM_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/comm/communicator.h"

namespace optstep {
namespace internal {
struct NcclHandles;  // the ncclComm_t, its stream and scratch memory (nccl_communicator.cc)
}  // namespace internal

// Collectives between GPU buffers with NCCL (kind "nccl"; --config=cuda builds only). One rank
// per GPU: the ranks of a group must use distinct devices (NCCL refuses two ranks of one
// communicator on the same GPU). Buffers are device memory of options.device_ordinal.
//
// The communicator is non-blocking NCCL (config.blocking = 0) on a stream of its own. Each
// collective validates its arguments on the host, enqueues the NCCL work and waits for it by
// polling the stream and ncclCommGetAsyncError until options.timeout: on completion it
// answers OK, so the buffers may be used at once from any stream. At the timeout it aborts the
// NCCL communicator (ncclCommAbort) and answers DEADLINE_EXCEEDED; a failure that NCCL reports
// answers UNAVAILABLE (system / remote errors) or INTERNAL. After either the communicator is
// broken and every later call answers UNAVAILABLE at once; create a new group to recover.
// Work enqueued by others on the buffers must be complete before a collective is called.
//
// Thread-compatible: one thread at a time. Each call makes the device current on the calling
// thread (cudaSetDevice). No NCCL or CUDA handle leaves this class.
class NcclCommunicator final : public Communicator {
 public:
  // Rank 0 creates the NCCL unique id and sets it in options.store under
  // "<options.prefix>/nccl/unique_id"; the other ranks get it from there. Then initialises the
  // NCCL communicator on options.device_ordinal; blocks until every rank has joined.
  // Codes: INVALID_ARGUMENT (options; an ordinal out of range), FAILED_PRECONDITION (no CUDA
  // device), DEADLINE_EXCEEDED (the id or some rank did not come within options.timeout),
  // UNAVAILABLE / INTERNAL (errors of NCCL or CUDA). The prefix must be new for each group.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const CommunicatorOptions& options);

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  // Finalises and destroys the NCCL communicator (bounded by the timeout; aborts it when
  // broken or when finalisation does not complete in time).
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  // A group of one ncclBroadcast per rank with a non-empty block (NCCL has no all-gather-v).
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  // An all-reduce of one element.
  absl::Status Barrier() override;

 private:
  NcclCommunicator(int rank, int world_size, std::string prefix, int ordinal,
                   absl::Duration timeout, std::unique_ptr<internal::NcclHandles> handles);

  // UNAVAILABLE once broken; else makes the device current.
  absl::Status Begin();
  // Waits for the work just enqueued (see the class comment). Marks the communicator broken
  // and aborts NCCL on error or timeout.
  absl::Status Finish(absl::string_view op, absl::Status enqueued);
  std::string Describe() const;

  const int rank_;
  const int world_size_;
  const std::string prefix_;
  const int ordinal_;
  const absl::Duration timeout_;
  std::unique_ptr<internal::NcclHandles> handles_;
  // OK until the first error of a collective, then that error.
  absl::Status broken_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_NCCL_COMMUNICATOR_H_
