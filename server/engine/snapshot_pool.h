#ifndef OPTSTEP_SERVER_ENGINE_SNAPSHOT_POOL_H_
#define OPTSTEP_SERVER_ENGINE_SNAPSHOT_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/dtype.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/replica_state.h"

namespace optstep {

// Recycles the storage of the snapshots a session's steps stream from (ParamSnapshot: the
// parameters a rank returns, written every step). A snapshot made by the pool comes back to it
// when its last reference is dropped (its streams ended and the next step released it), and the
// next one of the same kind takes that storage instead of allocating it: no allocation, zero
// fill or page faults for the returned parameters per step. The pool keeps at most one snapshot
// per kind (dtype, partial), until Trim.
//
// Thread-safe. A snapshot's last reference may be dropped on any thread (a stream's); the pool's
// lock orders that thread's reads of it before the writes of the step that reuses it.
class SnapshotPool {
 public:
  SnapshotPool();
  // Snapshots still referenced are freed, not kept, when their last reference goes.
  ~SnapshotPool();

  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;

  // EmptySnapshot(replica, dtype, step, partial) (replica_snapshot.h), in the storage of a kept
  // snapshot of that kind whose values have the same sizes, if there is one (its old bytes stay
  // until the step writes them); its readiness unset.
  std::shared_ptr<ParamSnapshot> Make(const ReplicaState& replica, DType dtype, uint64_t step,
                                      bool partial);
  // Frees the snapshots kept (a step took what it reuses; the rest is not kept beside it).
  void Trim();
  // How many snapshots are kept now.
  size_t kept() const;

 private:
  struct Shelf;  // the lock and the kept snapshots, shared with the snapshots' deleters
  const std::shared_ptr<Shelf> shelf_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SNAPSHOT_POOL_H_
