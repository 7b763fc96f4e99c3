#include "server/engine/shadow_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<ShadowState>> ShadowState::Create(const ReplicaState& replica) {
  const int world = replica.layout().world_size;
  if (world < 2) {
    return absl::InternalError(absl::StrCat("session '", replica.session_id(),
                                            "': a shadow needs two ranks, not ", world));
  }
  const int owner = (replica.rank() + world - 1) % world;
  OPTSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<ReplicaState> shadow,
      ReplicaState::CreateShadow(replica.session_id(), replica.config(), replica.layout(), owner,
                                 replica.device_ptr()));
  return std::unique_ptr<ShadowState>(new ShadowState(std::move(shadow)));
}

int64_t ShadowBytes(const ReplicaState& shadow) {
  const ReplicaState::Bytes bytes = shadow.bytes();
  return bytes.params + bytes.state + bytes.buffers;
}

absl::StatusOr<std::shared_ptr<const StateDict>> ExportOwned(ReplicaState& replica) {
  StateSelection selection;
  selection.params = StateSelection::Params::kOwned;
  StepCounters counters;
  counters.step = replica.owned_applied_step();
  // The tensors are read at once, on this thread: nothing else keeps them alive meanwhile.
  return CopyStateToHost(SelectState(replica, selection, nullptr, counters));
}

absl::Status ImportOwned(ReplicaState& replica, std::shared_ptr<const StateDict> state) {
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<ResolvedState> resolved,
                           ResolveState(replica, std::move(state)));
  if (!resolved->step) {
    return absl::InvalidArgumentError(
        absl::StrCat("session '", replica.session_id(), "': the owned state of rank ",
                     replica.rank(), " has no meta/step (the last step applied to it)"));
  }
  OPTSTEP_RETURN_IF_ERROR(WriteResolvedState(replica, *resolved));
  replica.set_owned_applied_step(*resolved->step);
  return absl::OkStatus();
}

}  // namespace optstep
