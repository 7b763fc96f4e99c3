#ifndef OPTSTEP_TESTS_TESTING_FAULT_INJECTING_COMMUNICATOR_H_
#define OPTSTEP_TESTS_TESTING_FAULT_INJECTING_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/comm/communicator.h"
#include "tests/testing/fault_injector.h"

namespace optstep {
namespace testutil {

// A Communicator that forwards every collective to another one and injects the faults set in
// faults(): fail the n-th call of "AllReduce", "AllGatherV", "Broadcast", "RingShift" or
// "Barrier" with a given status (the call is then not forwarded: this rank leaves its peers waiting
// in the collective, as a rank that lost its connection does), fail it after it was forwarded
// (FailAfterCall: the peers completed it, this rank alone sees it fail), delay it, or corrupt its
// result.
// rank() and world_size() are only forwarded.
//
// Corruption happens after a successful collective, in host memory (the "local" and "gloo"
// kinds; not NCCL's device buffers): the first element of the result becomes NaN (kFloat32,
// kFloat64) or has its bits flipped (kUint8).
//
// Thread safety: as the wrapped communicator (one thread at a time); faults() may be changed from
// any thread at any time.
class FaultInjectingCommunicator final : public Communicator {
 public:
  explicit FaultInjectingCommunicator(std::unique_ptr<Communicator> base);

  FaultInjectingCommunicator(const FaultInjectingCommunicator&) = delete;
  FaultInjectingCommunicator& operator=(const FaultInjectingCommunicator&) = delete;

  FaultInjector& faults() { return faults_; }

  int rank() const override;
  int world_size() const override;
  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override;
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override;
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override;
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override;
  absl::Status Barrier() override;

 private:
  // Counts the call, applies its faults around `forward` and corrupts the first element of
  // `result` (`count` elements of `dtype`) when told to.
  template <typename Forward>
  absl::Status Run(const char* method, void* result, int64_t count, CommDType dtype,
                   Forward forward);

  const std::unique_ptr<Communicator> base_;
  FaultInjector faults_;
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_FAULT_INJECTING_COMMUNICATOR_H_
