#include "server/engine/snapshot_pool.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/replica_snapshot.h"

namespace optstep {

struct SnapshotPool::Shelf {
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
  std::vector<std::unique_ptr<ParamSnapshot>> kept ABSL_GUARDED_BY(mu);

  // A snapshot's last reference went: kept in place of one of its kind (freed instead once the
  // pool is gone). What is freed is freed outside the lock.
  void Keep(std::unique_ptr<ParamSnapshot> snapshot) ABSL_LOCKS_EXCLUDED(mu) {
    snapshot->hold.reset();                // what holding it cost is given back now
    std::unique_ptr<ParamSnapshot> freed;  // declared before the lock: destroyed after it
    absl::MutexLock lock(&mu);
    if (!open) {
      freed = std::move(snapshot);
      return;
    }
    for (std::unique_ptr<ParamSnapshot>& k : kept) {
      if (k->dtype == snapshot->dtype && k->partial == snapshot->partial) {
        freed = std::exchange(k, std::move(snapshot));
        return;
      }
    }
    kept.push_back(std::move(snapshot));
  }
};

namespace {

// Whether `snapshot`'s values have the sizes EmptySnapshot gives them.
bool Fits(const ParamSnapshot& snapshot, const ReplicaState& replica) {
  if (snapshot.values.size() != static_cast<size_t>(replica.num_params())) return false;
  for (int p = 0; p < replica.num_params(); ++p) {
    if (snapshot.values[p].size() !=
        SnapshotValueBytes(replica, snapshot.dtype, snapshot.partial, p)) {
      return false;
    }
  }
  return true;
}

}  // namespace

SnapshotPool::SnapshotPool() : shelf_(std::make_shared<Shelf>()) {}

SnapshotPool::~SnapshotPool() {
  std::vector<std::unique_ptr<ParamSnapshot>> freed;
  absl::MutexLock lock(&shelf_->mu);
  shelf_->open = false;
  freed.swap(shelf_->kept);
}

std::shared_ptr<ParamSnapshot> SnapshotPool::Make(const ReplicaState& replica, DType dtype,
                                                  uint64_t step, bool partial) {
  std::unique_ptr<ParamSnapshot> storage;
  {
    absl::MutexLock lock(&shelf_->mu);
    for (std::unique_ptr<ParamSnapshot>& k : shelf_->kept) {
      if (k->dtype == dtype && k->partial == partial && Fits(*k, replica)) {
        std::swap(k, shelf_->kept.back());
        storage = std::move(shelf_->kept.back());
        shelf_->kept.pop_back();
        break;
      }
    }
  }
  if (storage == nullptr) storage = EmptySnapshot(replica, dtype, step, partial);
  storage->step = step;
  storage->readiness = nullptr;
  storage->hold = std::make_shared<SnapshotHold>();
  std::weak_ptr<Shelf> shelf = shelf_;
  return std::shared_ptr<ParamSnapshot>(storage.release(), [shelf](ParamSnapshot* snapshot) {
    std::unique_ptr<ParamSnapshot> owned(snapshot);
    if (std::shared_ptr<Shelf> open = shelf.lock()) open->Keep(std::move(owned));
  });
}

void SnapshotPool::Trim() {
  std::vector<std::unique_ptr<ParamSnapshot>> freed;
  absl::MutexLock lock(&shelf_->mu);
  freed.swap(shelf_->kept);
}

size_t SnapshotPool::kept() const {
  absl::MutexLock lock(&shelf_->mu);
  return shelf_->kept.size();
}

}  // namespace optstep
