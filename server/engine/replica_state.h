#ifndef OPTSTEP_SERVER_ENGINE_REPLICA_STATE_H_
#define OPTSTEP_SERVER_ENGINE_REPLICA_STATE_H_

// One rank's replica of a session's model: the tensors a step reads and writes
// (docs/design.md §3).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/layout.h"
#include "checkpoint/state_dict.h"
#include "kernels/device.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/session_config.h"
#include "server/engine/step_schedule.h"
#include "server/optim/optimizer.h"
#include "server/optim/routing.h"

namespace optstep {

// One hyperparameter group as created: its routing and its configured optimizer.
struct GroupRuntime {
  ParamGroup def;
  std::unique_ptr<Optimizer> optimizer;
  uint64_t applied_steps = 0;  // Adam's t after the last applied step
};

// The all-gather's view of the masters: one flat fp32 buffer of every rank's block, in rank
// order (a block holds the masters its rank owns, by parameter id).
struct MasterBlocks {
  float* data = nullptr;
  std::vector<int64_t> counts;   // elements of each rank's block
  std::vector<int64_t> offsets;  // first element of each rank's block
};

// The tensors of one rank's replica: the fp32 masters it holds (under REPLICATED storage every
// master, one flat buffer ordered by owner rank, so that each rank's parameters are contiguous
// for the all-gather; under OWNERS storage only its owned ones), and for the parameters this rank
// owns the optimizer state and one gradient buffer; the groups and their optimizers.
// replica_state_dict.h answers the state dict view of them (select, read, resolve, write).
//
// Thread-compatible: the Session orders every access. Its structure (names, sizes, owners,
// groups' definitions) is fixed at Create and may be read by any thread. Masters, optimizer
// state and group counters are written only by tasks of the session's coordinator (on the
// device worker it waits for, initial values too); held operations read
// them only while the session is settled, when no resolution runs. A gradient buffer is written
// by the stream threads in the disjoint ranges StepContributions admits; once complete, it is
// read (and averaged) by the session's statistics task on the device worker while no copy of it
// is in flight and none starts (GradientStatistics), and by the coordinator only once no copy
// is in flight.
class ReplicaState {
 public:
  // Routes the parameters, creates the group optimizers and allocates every tensor of `rank`:
  // every master, or (config.storage OWNERS) those `rank` owns.
  // INVALID_ARGUMENT for invalid chains (naming the parameter); RESOURCE_EXHAUSTED over
  // `max_bytes` (0: unlimited).
  static absl::StatusOr<std::unique_ptr<ReplicaState>> Create(std::string session_id,
                                                              SessionConfig config, Layout layout,
                                                              int rank, int64_t max_bytes,
                                                              std::shared_ptr<Device> device);
  // A shadow of rank `owner`'s replica (shadow_state.h): the masters, optimizer state and
  // gradient buffers of the parameters `owner` owns, nothing of the others (param(p) is empty
  // for them, and masters() spans `owner`'s block only).
  static absl::StatusOr<std::unique_ptr<ReplicaState>> CreateShadow(std::string session_id,
                                                                    SessionConfig config,
                                                                    Layout layout, int owner,
                                                                    std::shared_ptr<Device> device);

  ReplicaState(const ReplicaState&) = delete;
  ReplicaState& operator=(const ReplicaState&) = delete;

  const SessionConfig& config() const { return config_; }
  const Layout& layout() const { return layout_; }
  int rank() const { return rank_; }
  const std::string& session_id() const { return id_; }  // names the session in messages
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& device_ptr() const { return device_; }
  int num_params() const { return static_cast<int>(numels_.size()); }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int64_t>& numels() const { return numels_; }
  bool owns(int param) const { return layout_.owner[param] == rank_; }
  // Whether this replica keeps the master of `param` (param(p) is empty otherwise).
  bool holds(int param) const { return all_masters_ || owns(param); }
  // REPLICATED storage: every master, all-gathered after each step.
  bool holds_every_master() const { return all_masters_; }
  const std::vector<int>& owned() const { return owned_; }  // ascending ids
  int group_of(int param) const { return group_of_[param]; }
  std::vector<GroupRuntime>& groups() { return groups_; }
  const std::vector<GroupRuntime>& groups() const { return groups_; }
  // Every group's optimizer defaults.
  StepSchedule DefaultSchedule() const;

  Tensor& param(int p) { return params_[p]; }  // a view into the masters
  Tensor& grad(int p) { return grads_[p]; }    // empty unless owned
  // Every owned gradient buffer as one flat buffer, by ascending parameter id (what a step
  // ships to the buddy, shadow_state.h).
  float* owned_grads() { return owned_grads_.numel() > 0 ? owned_grads_.f32() : nullptr; }
  int64_t owned_numel() const { return owned_grads_.numel(); }
  // The last step whose update was applied to the owned parameters and their state (0: none):
  // a step redone after an interruption is not applied twice (docs/design.md, "State
  // redundancy"). Written with the owned tensors.
  uint64_t owned_applied_step() const { return owned_applied_step_; }
  void set_owned_applied_step(uint64_t step) { owned_applied_step_ = step; }
  ParamState& state(int p) { return states_[p]; }
  // The all-gather's view of the masters.
  const MasterBlocks& masters() { return blocks_; }

  struct Bytes {
    int64_t params = 0;
    int64_t state = 0;
    int64_t buffers = 0;  // gradient buffers
  };
  Bytes bytes() const;

  // Elements in `bytes` of `dtype` for param_id: NOT_FOUND for an unknown id, INVALID_ARGUMENT
  // for a length that is not a whole number of elements.
  absl::StatusOr<int64_t> ElementCount(int param_id, DType dtype, size_t bytes) const;
  // As ElementCount, and INVALID_ARGUMENT unless [offset, offset + count) lies in the parameter.
  absl::StatusOr<int64_t> ValueCount(int param_id, int64_t offset, DType dtype, size_t bytes) const;
  // Writes `count` values of `dtype` into the master of `param_id` from `offset`; a master this
  // replica does not hold (OWNERS storage) is left alone (OK: its owner keeps it).
  // REQUIRES: ValueCount answered `count`; no step has begun.
  absl::Status WriteValues(int param_id, int64_t offset, DType dtype, const void* data,
                           int64_t count);

 private:
  ReplicaState(std::string session_id, SessionConfig config, Layout layout, int rank,
               std::shared_ptr<Device> device);
  // Create, with every rank's masters or (a shadow) only `rank`'s.
  static absl::StatusOr<std::unique_ptr<ReplicaState>> Build(std::string session_id,
                                                             SessionConfig config, Layout layout,
                                                             int rank, int64_t max_bytes,
                                                             std::shared_ptr<Device> device,
                                                             bool all_masters);

  const std::string id_;
  const SessionConfig config_;
  const Layout layout_;
  const int rank_;
  const std::shared_ptr<Device> device_;
  const std::vector<std::string> names_;
  const std::vector<int64_t> numels_;
  std::vector<GroupRuntime> groups_;
  std::vector<int> group_of_;   // param -> group
  std::vector<int> owned_;      // ids of the parameters this rank owns, ascending
  Tensor masters_;              // the masters held, flat, ordered by (owner rank, param id)
  MasterBlocks blocks_;         // masters_ by rank
  std::vector<Tensor> params_;  // views into masters_
  std::vector<ParamState> states_;
  // One gradient buffer per owned parameter: SHARDED, the trainers' disjoint chunks; REPLICATED,
  // the trainers' sum in trainer order (then their mean). Views into owned_grads_.
  std::vector<Tensor> grads_;
  Tensor owned_grads_;  // every owned gradient buffer, flat, by parameter id
  uint64_t owned_applied_step_ = 0;
  bool all_masters_ = true;  // set once by Build
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_REPLICA_STATE_H_
