#ifndef OPTSTEP_SERVER_ENGINE_GRADIENT_SHIPMENT_H_
#define OPTSTEP_SERVER_ENGINE_GRADIENT_SHIPMENT_H_

// One step's ring shift of the owned gradients under state redundancy (shadow_state.h): each
// rank sends its owned gradients to its buddy and receives its predecessor's into its shadow,
// in rounds of at most kRoundElements, on a thread of its own. The owned update runs meanwhile
// and steps each parameter once its gradient is out (WaitSent): the update may scale a gradient
// in place, and the buddy must get it unscaled. Once a round failed nothing reads the gradients
// any more, and the update goes on to its end (StepCoordinator::ShippedBatches).
//
// Every rank runs the same rounds (as many as the largest owned block needs; a rank with less
// sends nothing in the last ones), so the rounds pair up around the ring whatever each rank owns.

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/serial_executor.h"
#include "kernels/comm/communicator.h"

namespace optstep {

// Thread-safe. The buffers and the communicator must outlive Wait(), and nothing else may use
// the communicator meanwhile.
class GradientShipment {
 public:
  // 16 MiB of fp32 a round: long enough that a round's overhead is small, short enough that the
  // update starts soon.
  static constexpr int64_t kRoundElements = int64_t{4} << 20;

  // Posts the rounds, of `round_elements` each, to `thread`. `block_counts`: every rank's owned
  // elements (the rounds), so block_counts[rank] == send_count and block_counts[predecessor] ==
  // recv_count; every rank passes the same.
  GradientShipment(Communicator* comm, const float* send, int64_t send_count, float* recv,
                   int64_t recv_count, const std::vector<int64_t>& block_counts,
                   SerialExecutor* thread, int64_t round_elements = kRoundElements);
  // Waits for the rounds to end (a shipment is always waited for).
  ~GradientShipment();

  GradientShipment(const GradientShipment&) = delete;
  GradientShipment& operator=(const GradientShipment&) = delete;

  // Blocks until the first `count` elements of `send` are out (and no longer read), or a round
  // failed: then its error. Answers how many are out (at least `count` when OK).
  absl::StatusOr<int64_t> WaitSent(int64_t count);
  // Blocks until every round ended; OK once the predecessor's gradients are all in `recv` and
  // the own ones out.
  absl::Status Wait();

 private:
  void Ship();  // on the thread

  Communicator* const comm_;
  const float* const send_;
  const int64_t send_count_;
  float* const recv_;
  const int64_t recv_count_;
  const int64_t round_elements_;
  int64_t rounds_ = 0;

  absl::Mutex mu_;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;  // elements of `send_` out
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_GRADIENT_SHIPMENT_H_
