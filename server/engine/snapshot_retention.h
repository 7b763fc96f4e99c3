#ifndef OPTSTEP_SERVER_ENGINE_SNAPSHOT_RETENTION_H_
#define OPTSTEP_SERVER_ENGINE_SNAPSHOT_RETENTION_H_

// What a session's snapshots held by streams cost once the session stepped on (docs/security.md,
// "Step streams"). Each step makes a snapshot of the parameters it returns (per dtype), and a
// stream that reads one slowly (a pull, a step's reply) keeps it while the session steps on: a
// tenant with many trainers, each with a few streams open, could keep a snapshot of every step.
// The newest kInHeadroom snapshots of each kind (dtype, partial) stay in the rank's headroom, as
// the current and the last step's do; each older one still held takes its bytes from the rank's
// budget, counted as the session owner's, until it is freed; one that does not fit is let go:
// its streams end at their next chunk, RESOURCE_EXHAUSTED (SnapshotHold, ParamChunker).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/memory_budget.h"
#include "server/engine/param_snapshot.h"

namespace optstep {

// Thread-safe.
class SnapshotRetention {
 public:
  static constexpr int kInHeadroom = 2;

  // Takes `bytes` from the rank's budget (and the owner's share); RESOURCE_EXHAUSTED when they do
  // not fit.
  using Reserve = std::function<absl::StatusOr<MemoryBudget::Reservation>(int64_t bytes)>;

  // `session_id` names the session in the streams' errors; a null `reserve` charges nothing and
  // lets nothing go.
  SnapshotRetention(std::string session_id, Reserve reserve)
      : session_id_(std::move(session_id)), reserve_(std::move(reserve)) {}

  // A new snapshot of the session: tracked from now on. The older ones of its kind still held
  // beyond the headroom are charged, or let go where they do not fit.
  void Track(const std::shared_ptr<const ParamSnapshot>& snapshot) ABSL_LOCKS_EXCLUDED(mu_);

  // The snapshots tracked that are still held (for tests).
  int held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Tracked {
    std::weak_ptr<const ParamSnapshot> snapshot;
    DType dtype;
    bool partial;
    bool settled = false;  // charged or let go
  };

  const std::string session_id_;
  const Reserve reserve_;
  mutable absl::Mutex mu_;
  std::vector<Tracked> tracked_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SNAPSHOT_RETENTION_H_
