#include "server/engine/gradient_shipment.h"

#include <algorithm>

#include "absl/status/statusor.h"

namespace optstep {

GradientShipment::GradientShipment(Communicator* comm, const float* send, int64_t send_count,
                                   float* recv, int64_t recv_count,
                                   const std::vector<int64_t>& block_counts, SerialExecutor* thread,
                                   int64_t round_elements)
    : comm_(comm),
      send_(send),
      send_count_(send_count),
      recv_(recv),
      recv_count_(recv_count),
      round_elements_(round_elements) {
  for (int64_t count : block_counts) {
    rounds_ = std::max(rounds_, (count + round_elements_ - 1) / round_elements_);
  }
  thread->Post([this] { Ship(); });
}

GradientShipment::~GradientShipment() { Wait().IgnoreError(); }

void GradientShipment::Ship() {
  absl::Status status;
  for (int64_t round = 0; round < rounds_ && status.ok(); ++round) {
    const int64_t first = round * round_elements_;
    const int64_t sends = std::clamp<int64_t>(send_count_ - first, 0, round_elements_);
    const int64_t receives = std::clamp<int64_t>(recv_count_ - first, 0, round_elements_);
    status =
        comm_->RingShift(sends > 0 ? send_ + first : nullptr, sends,
                         receives > 0 ? recv_ + first : nullptr, receives, CommDType::kFloat32);
    absl::MutexLock lock(&mu_);
    if (status.ok()) sent_ = first + sends;
  }
  absl::MutexLock lock(&mu_);
  if (status.ok()) sent_ = send_count_;  // also with no rounds (one rank owning nothing)
  status_ = status;
  ended_ = true;
}

absl::StatusOr<int64_t> GradientShipment::WaitSent(int64_t count) {
  absl::MutexLock lock(&mu_);
  // Evaluated by Await with mu_ held.
  const auto out = [this, count]()
                       ABSL_NO_THREAD_SAFETY_ANALYSIS { return ended_ || sent_ >= count; };
  mu_.Await(absl::Condition(&out));
  if (!status_.ok()) return status_;
  return sent_;
}

absl::Status GradientShipment::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&ended_));
  return status_;
}

}  // namespace optstep
