#include "server/engine/replica_snapshot.h"

namespace optstep {

namespace {

// Whether a snapshot (partial or not) has a value of `param`.
bool InSnapshot(const ReplicaState& replica, bool partial, int param) {
  return partial ? replica.owns(param) : replica.holds(param);
}

}  // namespace

std::unique_ptr<ParamSnapshot> EmptySnapshot(const ReplicaState& replica, DType dtype,
                                             uint64_t step, bool partial) {
  auto snapshot = std::make_unique<ParamSnapshot>();
  snapshot->step = step;
  snapshot->dtype = dtype;
  snapshot->partial = partial;
  snapshot->values.resize(replica.num_params());
  for (int p = 0; p < replica.num_params(); ++p) {
    snapshot->values[p].resize(SnapshotValueBytes(replica, dtype, partial, p));
  }
  return snapshot;
}

size_t SnapshotValueBytes(const ReplicaState& replica, DType dtype, bool partial, int param) {
  return InSnapshot(replica, partial, param) ? replica.numels()[param] * DTypeSize(dtype) : 0;
}

absl::Status CopyToSnapshot(ReplicaState& replica, int param, ParamSnapshot& snapshot) {
  if (!InSnapshot(replica, snapshot.partial, param)) return absl::OkStatus();
  const Tensor& master = replica.param(param);
  return replica.device().CopyToHost(master, 0, master.numel(), snapshot.dtype,
                                     snapshot.values[param].data());
}

}  // namespace optstep
