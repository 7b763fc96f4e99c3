#ifndef OPTSTEP_SERVER_ENGINE_SESSION_H_
#define OPTSTEP_SERVER_ENGINE_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/comm/communicator.h"
#include "kernels/device.h"
#include "server/engine/device_worker.h"
#include "server/engine/layout.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/session_config.h"
#include "server/engine/state_dict.h"
#include "server/engine/step_contributions.h"
#include "server/optim/optimizer.h"
#include "server/optim/routing.h"

namespace optstep {

// This step's schedule values for one group; unset values keep the group's defaults.
struct GroupStepValues {
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

// What a trainer says when it starts its part of a step.
struct StepBegin {
  uint64_t step = 0;  // 1-based number of the step to apply
  int trainer = 0;
  std::map<int, GroupStepValues> schedules;  // by group id
  DType return_dtype = DType::kF32;
  bool return_params = true;
};

// A trainer's handle on the step it began. Obtained from Session::Begin; used for its chunks and
// its commit. Becomes stale (ABORTED) when the step is aborted or the trainer begins again.
struct Contribution {
  int trainer = 0;
  uint64_t step = 0;
  uint64_t generation = 0;  // session generation when begun
  uint64_t attempt = 0;     // trainer's attempt number within the generation
  DType return_dtype = DType::kF32;
  bool return_params = true;
  // The trainer already committed this step (a retry after a broken stream), or the step was
  // already applied (replay): chunks are ignored and the commit waits for / returns the result.
  bool retry = false;
  bool replay = false;
};

struct StepOutcome {
  uint64_t step = 0;
  bool skipped = false;
  double grad_norm = 0.0;  // pre-clip global norm; 0 when skipped
  bool clipped = false;
  std::shared_ptr<const ParamSnapshot> params;  // null when the trainer asked for none
};

using StepCallback = std::function<void(absl::StatusOr<StepOutcome>)>;
using SnapshotCallback = std::function<void(absl::StatusOr<std::shared_ptr<const ParamSnapshot>>)>;

struct SessionStats {
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
  int64_t param_bytes = 0;
  int64_t state_bytes = 0;
  int64_t buffer_bytes = 0;  // gradient buffers and staging
};

// One hyperparameter group as created: its routing and its configured optimizer.
struct GroupRuntime {
  ParamGroup def;
  std::unique_ptr<Optimizer> optimizer;
  uint64_t applied_steps = 0;  // Adam's t after the last applied step
};

// One rank's replica of a registered model: every fp32 master parameter (one flat buffer ordered
// by owner rank, so that each rank's parameters are contiguous for the all-gather), and for the
// parameters this rank owns the optimizer state and gradient buffers; the step contract of
// DESIGN.md §3 across the ranks of the session's communicator.
//
// Threads: stream handlers call Begin / AddGradient / Commit concurrently. Each session has a
// coordinator thread that runs its steps, aborts and snapshots in order and is the only thread
// that waits on the session's collectives; device math is posted from there to the engine's
// shared DeviceWorker, whose tasks never wait on anything. So a collective of one session never
// holds up another session's steps, on any rank.
class Session : public std::enable_shared_from_this<Session> {
 public:
  struct Options {
    std::string id;
    SessionConfig config;
    Layout layout;
    int rank = 0;
    // The session's group: every rank of the layout. World size 1: a local communicator.
    std::unique_ptr<Communicator> comm;
    absl::Duration step_deadline = absl::Seconds(60);
    int64_t max_bytes = 0;  // 0: unlimited
  };

  // Routes parameters, creates the group optimizers and allocates every tensor.
  // INVALID_ARGUMENT for invalid chains (naming the parameter); RESOURCE_EXHAUSTED over max_bytes.
  // The session shares ownership of the device and the device worker, so that both outlive it
  // (a session can be released after the engine, by its own coordinator's last task).
  static absl::StatusOr<std::shared_ptr<Session>> Create(Options options,
                                                         std::shared_ptr<Device> device,
                                                         std::shared_ptr<DeviceWorker> worker);
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  const SessionConfig& config() const { return config_; }
  const Layout& layout() const { return layout_; }
  const std::vector<GroupRuntime>& groups() const { return groups_; }
  SessionStats stats() const;

  // Starts (or resumes) `begin.trainer`'s part of step `begin.step`.
  // INVALID_ARGUMENT: trainer out of range, unknown group, invalid lr/weight decay, schedule
  // differing from another trainer's; FAILED_PRECONDITION: step out of sequence (names the
  // expected step); UNAVAILABLE: session closed.
  absl::StatusOr<Contribution> Begin(const StepBegin& begin);

  // Copies a gradient chunk (`bytes` raw bytes of `dtype`) into the step's buffers.
  // NOT_FOUND: unknown param_id; INVALID_ARGUMENT: byte length, range, overlap, duplicate;
  // ABORTED: the contribution is stale.
  absl::Status AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
                           const void* data, size_t bytes);

  // Commits the contribution. On OK, `done` is called exactly once (possibly on another thread,
  // possibly before Commit returns) with the outcome of the step, or with ABORTED when the step is
  // aborted. On error `done` is never called: INVALID_ARGUMENT for missing coverage or an element
  // count mismatch (the trainer's contribution is dropped; it should resend), ABORTED when stale.
  absl::Status Commit(const Contribution& c, uint64_t num_elements, StepCallback done);

  // Sets initial values of a parameter range. FAILED_PRECONDITION once a step has begun.
  absl::Status InitValues(int param_id, int64_t offset, DType dtype, const void* data, size_t bytes);

  // The parameters after the last step, in `dtype`. `done` is called exactly once.
  void GetSnapshot(DType dtype, SnapshotCallback done);

  // The state dict (masters, optimizer state, counters) as it was after the last step, for the
  // parameters of `model_chunks` (all when empty). `done` is called exactly once.
  // FAILED_PRECONDITION when the session spans several ranks (not available yet).
  void ExportState(std::vector<uint32_t> model_chunks,
                   std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)> done);
  // Replaces masters, optimizer state and counters with the tensors of `state` (any subset of
  // the keys ExportState answers). Everything is validated before anything changes:
  // INVALID_ARGUMENT names an unknown key or a shape / type mismatch. FAILED_PRECONDITION while
  // a step is pending or on several ranks. `done` is called exactly once.
  void ImportState(std::shared_ptr<const StateDict> state, std::function<void(absl::Status)> done);

  // Aborts the pending step on every rank when it began more than the step deadline before
  // `now` (through the session's collective, so that all ranks abort together).
  void AbortIfExpired(absl::Time now);
  // Aborts the pending step and refuses further steps (UNAVAILABLE).
  void Close();
  // False once a collective failed (a peer was lost): the session answers UNAVAILABLE.
  bool healthy() const;

 private:
  struct Waiter {
    DType dtype;
    bool want_params;
    StepCallback done;
  };

  Session(Options options, std::shared_ptr<Device> device, std::shared_ptr<DeviceWorker> worker);
  absl::Status Allocate();
  absl::Status AllocateMasters();
  // Runs `task` on the device worker and waits for it. Called only on the coordinator.
  absl::Status OnDevice(const std::function<absl::Status()>& task);

  // UNAVAILABLE once closed or broken.
  absl::Status CheckUsable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckFresh(const Contribution& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elements in `bytes` of `dtype` for param_id: NOT_FOUND for an unknown id, INVALID_ARGUMENT
  // for a length that is not a whole number of elements.
  absl::StatusOr<int64_t> ElementCount(int param_id, DType dtype, size_t bytes) const;
  absl::StatusOr<std::vector<std::pair<double, double>>> ResolveSchedule(const StepBegin& begin) const;
  Tensor& GradientTarget(int trainer, int param_id);
  // Drops the pending step; returns the callbacks to notify (outside the lock).
  std::vector<StepCallback> AbortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Coordinator: averages, checks, agrees with the other ranks, clips, steps, all-gathers; then
  // publishes. With `abort`, this rank votes to abort the pending step.
  void RunStep(bool abort);
  // The global phase after the local statistics: decides skip / abort, steps, gathers.
  struct Agreement {
    bool abort = false;
    bool skipped = false;
    double grad_norm = 0.0;
  };
  absl::StatusOr<Agreement> Agree(bool abort, const std::vector<double>& sum_squares, bool finite);
  absl::Status ApplyStep(const std::vector<std::pair<double, double>>& schedule,
                         const Agreement& agreement, StepOutcome& outcome);
  void FinishStep(absl::StatusOr<StepOutcome> outcome, bool aborted);
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BuildSnapshot(DType dtype, uint64_t step);
  absl::StatusOr<std::shared_ptr<const StateDict>> BuildStateDict(
      const std::vector<uint32_t>& model_chunks);
  absl::Status ApplyStateDict(const StateDict& state);

  const std::string id_;
  const SessionConfig config_;
  const Layout layout_;
  const int rank_;
  const absl::Duration step_deadline_;
  const int64_t max_bytes_;
  const std::shared_ptr<Device> device_;
  const std::shared_ptr<DeviceWorker> worker_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;

  // Touched only on the coordinator after Create (and by InitValues before the first step).
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<DeviceWorker> coordinator_;
  std::vector<GroupRuntime> groups_;
  std::vector<int> group_of_;  // param -> group
  std::vector<int> owned_;     // ids of the parameters this rank owns, ascending
  Tensor masters_;             // every master, flat, ordered by (owner rank, param id)
  std::vector<int64_t> rank_counts_;   // elements of masters_ owned by each rank
  std::vector<int64_t> rank_offsets_;  // first element of each rank's block
  std::vector<Tensor> params_;         // views into masters_
  std::vector<ParamState> states_;
  std::vector<Tensor> grads_;                 // trainer 0's (or the shared SHARDED) buffer
  std::vector<std::vector<Tensor>> staging_;  // REPLICATED: trainers 1..N-1

  mutable absl::Mutex mu_;
  StepContributions contributions_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<std::pair<double, double>>> schedule_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> attempts_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::map<DType, std::shared_ptr<const ParamSnapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
  std::optional<StepOutcome> last_outcome_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> step_began_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t skipped_steps_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int inflight_copies_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SESSION_H_
