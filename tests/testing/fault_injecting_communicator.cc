#include "tests/testing/fault_injecting_communicator.h"

#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "base/status_macros.h"

namespace optstep {
namespace testutil {
namespace {

// Makes the first element of `data` (kFloat32, kFloat64: NaN; kUint8: its bits flipped) wrong.
void CorruptFirst(void* data, CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32: {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(data, &nan, sizeof(nan));
      break;
    }
    case CommDType::kFloat64: {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      std::memcpy(data, &nan, sizeof(nan));
      break;
    }
    case CommDType::kUint8:
      *static_cast<uint8_t*>(data) ^= 0xff;
      break;
  }
}

}  // namespace

FaultInjectingCommunicator::FaultInjectingCommunicator(std::unique_ptr<Communicator> base)
    : base_(std::move(base)),
      faults_({"AllReduce", "AllGatherV", "Broadcast", "RingShift", "Barrier"},
              {"AllReduce", "AllGatherV", "Broadcast", "RingShift"}) {}

template <typename Forward>
absl::Status FaultInjectingCommunicator::Run(const char* method, void* result, int64_t count,
                                             CommDType dtype, Forward forward) {
  bool corrupt = false;
  absl::Status after;
  OPTSTEP_RETURN_IF_ERROR(faults_.OnCall(method, &corrupt, &after));
  OPTSTEP_RETURN_IF_ERROR(forward());
  if (corrupt && count > 0) CorruptFirst(result, dtype);
  return after;
}

int FaultInjectingCommunicator::rank() const { return base_->rank(); }

int FaultInjectingCommunicator::world_size() const { return base_->world_size(); }

absl::Status FaultInjectingCommunicator::AllReduce(void* data, int64_t count, CommDType dtype,
                                                   ReduceOp op) {
  return Run("AllReduce", data, count, dtype,
             [&] { return base_->AllReduce(data, count, dtype, op); });
}

absl::Status FaultInjectingCommunicator::AllGatherV(const void* send, int64_t send_count,
                                                    void* recv,
                                                    const std::vector<int64_t>& recv_counts,
                                                    CommDType dtype) {
  const int64_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  return Run("AllGatherV", recv, total, dtype,
             [&] { return base_->AllGatherV(send, send_count, recv, recv_counts, dtype); });
}

absl::Status FaultInjectingCommunicator::Broadcast(void* data, int64_t count, CommDType dtype,
                                                   int root) {
  return Run("Broadcast", data, count, dtype,
             [&] { return base_->Broadcast(data, count, dtype, root); });
}

absl::Status FaultInjectingCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                                   int64_t recv_count, CommDType dtype) {
  return Run("RingShift", recv, recv_count, dtype,
             [&] { return base_->RingShift(send, send_count, recv, recv_count, dtype); });
}

absl::Status FaultInjectingCommunicator::Barrier() {
  return Run("Barrier", nullptr, 0, CommDType::kUint8, [&] { return base_->Barrier(); });
}

}  // namespace testutil
}  // namespace optstep
