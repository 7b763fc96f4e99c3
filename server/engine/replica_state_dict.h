#ifndef OPTSTEP_SERVER_ENGINE_REPLICA_STATE_DICT_H_
#define OPTSTEP_SERVER_ENGINE_REPLICA_STATE_DICT_H_

// The state dict view of one rank's replica (docs/checkpoints.md): its tensors selected by key
// and read in place, read into host memory, and a state dict checked against the replica then
// written into it. What may touch the tensors when is the ReplicaState's rule (replica_state.h):
// the Session calls these on its coordinator, or while the session is settled.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "server/engine/replica_state.h"

namespace optstep {

// Which tensors of a rank's state a held operation reads (see SessionHolds::HeldTensors).
struct StateSelection {
  std::vector<uint32_t> model_chunks;  // empty: every chunk
  enum class Params { kNone, kOwned, kAll };
  // Masters: kAll is every one this rank holds (all of them under REPLICATED storage, its owned
  // ones under OWNERS).
  Params params = Params::kAll;
  bool owned_state = true;  // optimizer state of the parameters this rank owns
  bool counters = true;     // "meta/..." and every group's step counter
};

// One tensor of a held state: its key (checkpoint/state_dict.h), type and shape, and a reader of
// its little-endian bytes [offset, offset + n) valid while the hold lasts (thread-safe).
struct HeldTensor {
  std::string key;
  StateTensor::Type type = StateTensor::Type::kF32;
  Shape shape;
  uint64_t bytes = 0;
  std::function<absl::Status(uint64_t offset, size_t n, void* dst)> read;
};

// The session's step counters, as a state dict holds them ("meta/step", "meta/skipped_steps").
struct StepCounters {
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
  // Between ranks only ("meta/masters_step", Session::ExportMasters): the step some masters are
  // at when it is ahead of `step` (a lost peer interrupted step + 1 after this rank's update).
  std::optional<uint64_t> masters_step;
};

// A state dict resolved against a replica: every destination checked, nothing written yet.
struct ResolvedState {
  std::shared_ptr<const StateDict> state;  // owns the bytes the targets point at
  std::vector<std::pair<const StateTensor*, Tensor*>> targets;
  std::optional<uint64_t> step, skipped_steps;
  std::optional<uint64_t> masters_step;              // only where ResolveState is told to take it
  std::vector<std::optional<uint64_t>> group_steps;  // by group id
  bool every_master = false;  // writes every master the replica holds (a part of them: not)
};

// This rank's tensors of `selection`, in key order; `owner` keeps the tensors alive while the
// readers are used; `counters` are the session's.
std::vector<HeldTensor> SelectState(ReplicaState& replica, const StateSelection& selection,
                                    std::shared_ptr<const void> owner,
                                    const StepCounters& counters);
// The tensors read into host memory.
// `after_each` (may be null) is called once each tensor is read; its error ends the copy.
absl::StatusOr<std::shared_ptr<const StateDict>> CopyStateToHost(
    const std::vector<HeldTensor>& tensors,
    const std::function<absl::Status()>& after_each = nullptr);
// Checks every key of `state` against `replica`: INVALID_ARGUMENT names an unknown key or a
// shape / type mismatch, and "meta/masters_step" unless `from_peer` (a heal's masters). A master
// the replica does not hold (OWNERS storage) is checked and left out. Writes nothing.
absl::StatusOr<std::shared_ptr<ResolvedState>> ResolveState(ReplicaState& replica,
                                                            std::shared_ptr<const StateDict> state,
                                                            bool from_peer = false);
// Writes the tensors and group counters of `resolved` into `replica` (the caller sets the step
// counters) and clears its owned_applied_step (the next step applies). On the device worker.
absl::Status WriteResolvedState(ReplicaState& replica, const ResolvedState& resolved);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_REPLICA_STATE_DICT_H_
