#include "server/engine/replica_snapshot.h"

#include <utility>

#include "base/status_macros.h"

namespace optstep {

namespace {

// Whether a snapshot (partial or not) has a value of `param`.
bool InSnapshot(const ReplicaState& replica, bool partial, int param) {
  return partial ? replica.owns(param) : replica.holds(param);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BuildSnapshot(ReplicaState& replica,
                                                                   DType dtype, uint64_t step) {
  std::shared_ptr<ParamSnapshot> snapshot = EmptySnapshot(replica, dtype, step);
  for (int p = 0; p < replica.num_params(); ++p) {
    OPTSTEP_RETURN_IF_ERROR(CopyToSnapshot(replica, p, *snapshot));
  }
  return std::shared_ptr<const ParamSnapshot>(std::move(snapshot));
}

std::shared_ptr<ParamSnapshot> EmptySnapshot(const ReplicaState& replica, DType dtype,
                                             uint64_t step, bool partial) {
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->step = step;
  snapshot->dtype = dtype;
  snapshot->partial = partial;
  snapshot->values.resize(replica.num_params());
  for (int p = 0; p < replica.num_params(); ++p) {
    if (!InSnapshot(replica, partial, p)) continue;
    snapshot->values[p].resize(replica.numels()[p] * DTypeSize(dtype));
  }
  return snapshot;
}

std::shared_ptr<ParamSnapshot> ReuseOrEmptySnapshot(std::shared_ptr<const ParamSnapshot> released,
                                                    const ReplicaState& replica, DType dtype,
                                                    uint64_t step, bool partial) {
  // The only reference left is `released`: no stream or pull can reach it any more, so it may
  // be written. (Every snapshot is made as a ParamSnapshot, never a const object.)
  if (released == nullptr || released.use_count() != 1 || released->dtype != dtype ||
      released->partial != partial ||
      released->values.size() != static_cast<size_t>(replica.num_params())) {
    return EmptySnapshot(replica, dtype, step, partial);
  }
  for (int p = 0; p < replica.num_params(); ++p) {
    const size_t size =
        InSnapshot(replica, partial, p) ? replica.numels()[p] * DTypeSize(dtype) : 0;
    if (released->values[p].size() != size) return EmptySnapshot(replica, dtype, step, partial);
  }
  std::shared_ptr<ParamSnapshot> snapshot = std::const_pointer_cast<ParamSnapshot>(released);
  snapshot->step = step;
  snapshot->readiness = nullptr;
  return snapshot;
}

absl::Status CopyToSnapshot(ReplicaState& replica, int param, ParamSnapshot& snapshot) {
  if (!InSnapshot(replica, snapshot.partial, param)) return absl::OkStatus();
  const Tensor& master = replica.param(param);
  return replica.device().CopyToHost(master, 0, master.numel(), snapshot.dtype,
                                     snapshot.values[param].data());
}

}  // namespace optstep
