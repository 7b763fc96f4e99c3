#ifndef OPTSTEP_SERVER_ENGINE_STEP_OBSERVER_H_
#define OPTSTEP_SERVER_ENGINE_STEP_OBSERVER_H_

// What the engine reports about its work, for metrics and logs: step phase durations, bytes in
// and out, step and session events. The engine calls it from its own threads (stream handlers,
// session coordinators), so an implementation must be thread-safe and quick. The engine knows
// nothing of how the reports are exported (server/rpc/metrics does it with Prometheus).

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace optstep {

class StepObserver {
 public:
  enum class Phase {
    kIngest,     // first trainer's step header -> every contribution committed
    kStep,       // local statistics, agreement between ranks, clipping, optimizer kernels
    kAllGather,  // all-gather of the updated parameters (several ranks only)
    kEgress,     // first -> last parameter chunk written to a trainer
  };
  enum class StepEnd { kApplied, kSkipped, kAborted, kFailed };

  virtual ~StepObserver() = default;

  virtual void OnPhase(Phase phase, absl::Duration duration) {}
  // Raw gradient bytes accepted from trainers.
  virtual void OnBytesIn(int64_t bytes) {}
  // Raw parameter bytes handed to trainers.
  virtual void OnBytesOut(int64_t bytes) {}
  // `error` is empty unless `end` is kAborted or kFailed.
  virtual void OnStepEnd(const std::string& session, uint64_t step, int rank, StepEnd end,
                         absl::string_view error) {}
  virtual void OnSessionCreated(const std::string& session, int rank, int64_t params) {}
  virtual void OnSessionClosed(const std::string& session, int rank) {}
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_STEP_OBSERVER_H_
