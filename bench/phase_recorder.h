#ifndef OPTSTEP_BENCH_PHASE_RECORDER_H_
#define OPTSTEP_BENCH_PHASE_RECORDER_H_

// A StepObserver for the end-to-end benchmarks: keeps, per step phase, the longest duration any
// rank or stream reported since the last Take() (ranks and trainer streams work in parallel, so
// the slowest one is the phase's length). Thread-safe.

#include <array>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/step_observer.h"

namespace optstep {
namespace bench {

class PhaseRecorder final : public StepObserver {
 public:
  static constexpr int kPhases = 4;
  using Durations = std::array<absl::Duration, kPhases>;  // indexed by Phase

  void OnPhase(Phase phase, absl::Duration duration) override {
    absl::MutexLock lock(&mu_);
    absl::Duration& slot = longest_[static_cast<int>(phase)];
    if (duration > slot) slot = duration;
  }

  // The longest durations since the last call, and starts over.
  Durations Take() {
    absl::MutexLock lock(&mu_);
    Durations taken = longest_;
    longest_ = Durations();
    return taken;
  }

 private:
  absl::Mutex mu_;
  Durations longest_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_PHASE_RECORDER_H_
