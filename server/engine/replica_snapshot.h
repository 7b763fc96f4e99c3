#ifndef OPTSTEP_SERVER_ENGINE_REPLICA_SNAPSHOT_H_
#define OPTSTEP_SERVER_ENGINE_REPLICA_SNAPSHOT_H_

// Parameter snapshots of one rank's replica: its fp32 masters converted to the dtype a trainer
// asked for (ParamSnapshot). They read the masters, so they run where ReplicaState allows that:
// on the device worker, for the session's coordinator.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/dtype.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/replica_state.h"

namespace optstep {

// A snapshot of `dtype` with every value `replica` holds sized and none written; with `partial`,
// only the values of the parameters it owns (ParamSnapshot::partial).
std::unique_ptr<ParamSnapshot> EmptySnapshot(const ReplicaState& replica, DType dtype,
                                             uint64_t step, bool partial = false);
// The bytes of `param`'s value in a snapshot of `dtype` (0 for one it leaves out: a master the
// replica does not hold, or, `partial`, one it does not own).
size_t SnapshotValueBytes(const ReplicaState& replica, DType dtype, bool partial, int param);
// Writes the master of `param` into `snapshot` (nothing for one `replica` does not hold, or that
// a partial snapshot leaves out). On the device worker.
absl::Status CopyToSnapshot(ReplicaState& replica, int param, ParamSnapshot& snapshot);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_REPLICA_SNAPSHOT_H_
