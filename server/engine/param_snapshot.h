#ifndef OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_
#define OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/dtype.h"
#include "server/engine/memory_budget.h"

namespace optstep {

// Which parameters of a snapshot still being filled hold their final bytes, in the order they
// became ready. A step hands its snapshot to the streams before the optimizer runs, so that each
// parameter is sent back as soon as it is stepped and gathered (docs/design.md §2: stepping,
// gathering and sending back overlap). Thread-safe.
class ParamReadiness {
 public:
  // The bytes of `ids` are written: readers may use them. Wakes the waiting readers.
  void MarkReady(const std::vector<int>& ids) {
    ChangeAndWake([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      order_.insert(order_.end(), ids.begin(), ids.end());
    });
  }
  // The step failed after the snapshot was handed out: readers get `status` from now on.
  void Fail(absl::Status status) {
    ChangeAndWake([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { failed_ = std::move(status); });
  }
  // The step ended on this rank (FinishStep), its last parameters marked ready before: none
  // becomes ready any more. A stream ends only after this, even one that has every parameter it
  // returns: a trainer must not have a step that this rank may still be interrupted in (its
  // all-gather), or it would go on to the next step while this rank redoes this one.
  void End() {
    ChangeAndWake([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ended_ = true; });
  }
  // Whether the step ended (End); Fail's status once it failed. While it has not, `wake` (if
  // set) is called once (never within this call) when it ends, fails or more are ready.
  absl::StatusOr<bool> Ended(std::function<void()> wake) {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (ended_) return true;
    if (wake) waiting_.push_back(std::move(wake));
    return false;
  }
  // The id of the `index`-th parameter to become ready; nullopt while it is not, and then
  // `wake` (if set) is called once (on the thread that marks parameters ready, never within this
  // call) when more are ready or the step failed.
  absl::StatusOr<std::optional<int>> Get(size_t index, std::function<void()> wake) {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (index < order_.size()) return std::optional<int>(order_[index]);
    if (wake) waiting_.push_back(std::move(wake));
    return std::optional<int>();
  }

 private:
  // Runs `change` under the lock, then calls every waiting reader's wake without it.
  template <typename Change>
  void ChangeAndWake(Change change) {
    std::vector<std::function<void()>> wake;
    {
      absl::MutexLock lock(&mu_);
      change();
      wake.swap(waiting_);
    }
    for (auto& w : wake) w();
  }

  absl::Mutex mu_;
  std::vector<int> order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// What holding a snapshot after its session stepped on costs (SnapshotRetention): the bytes it
// takes from the rank's budget while streams still read it, or, where they did not fit, why it
// was let go: its streams end at their next chunk (ParamChunker). Thread-safe.
class SnapshotHold {
 public:
  // Keeps `charge` until the snapshot is freed.
  void Charge(MemoryBudget::Reservation charge) {
    absl::MutexLock lock(&mu_);
    charge_ = std::move(charge);
  }
  // The snapshot is let go: its streams end with `why`.
  void Revoke(absl::Status why) {
    absl::MutexLock lock(&mu_);
    revoked_ = std::move(why);
  }
  // OK while the snapshot may be read on; else Revoke's status.
  absl::Status Check() const {
    absl::MutexLock lock(&mu_);
    return revoked_;
  }
  int64_t charged() const {
    absl::MutexLock lock(&mu_);
    return charge_.bytes();
  }

 private:
  mutable absl::Mutex mu_;
  MemoryBudget::Reservation charge_ ABSL_GUARDED_BY(mu_);
  absl::Status revoked_ ABSL_GUARDED_BY(mu_);
};

// The parameters of a session as they were after one step, serialised once in one wire dtype and
// shared (read-only) by every stream that sends them. Immutable once complete; while a step
// fills it, `readiness` says which values may be read (values[p] is sized before it is shared
// and written once).
struct ParamSnapshot {
  uint64_t step = 0;
  DType dtype = DType::kF32;
  // values[param_id]: raw little-endian bytes, whole tensor; empty for a parameter whose master
  // the rank does not hold (OWNERS storage).
  std::vector<std::string> values;
  // Null: every value is there. Set: only the parameters it has marked ready.
  std::shared_ptr<ParamReadiness> readiness;
  // Only the parameters this rank owns, though it holds every master (REPLICATED storage, a step
  // whose streams return owned parameters only: StepBegin::return_owned); the others' values are
  // empty. Never published for pulls.
  bool partial = false;
  // Set by the session's SnapshotRetention while the snapshot is held beyond its headroom; a new
  // one for each use of the storage (SnapshotPool).
  std::shared_ptr<SnapshotHold> hold = std::make_shared<SnapshotHold>();
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_PARAM_SNAPSHOT_H_
