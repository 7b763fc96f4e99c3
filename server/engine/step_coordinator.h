#ifndef OPTSTEP_SERVER_ENGINE_STEP_COORDINATOR_H_
#define OPTSTEP_SERVER_ENGINE_STEP_COORDINATOR_H_

// The second half of a step (docs/design.md §3): once every contribution is in, one rank's
// coordinator averages, checks, agrees with the other ranks, clips, steps and all-gathers, and
// hands the result and the parameters to the trainers that wait for them.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/fair_executor.h"
#include "base/serial_executor.h"
#include "kernels/comm/communicator.h"
#include "kernels/device.h"
#include "server/engine/gradient_shipment.h"
#include "server/engine/gradient_statistics.h"
#include "server/engine/owned_update.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/replica_state.h"
#include "server/engine/shadow_state.h"
#include "server/engine/snapshot_pool.h"
#include "server/engine/step_observer.h"
#include "server/engine/step_schedule.h"

namespace optstep {

struct StepOutcome {
  uint64_t step = 0;
  bool skipped = false;
  double grad_norm = 0.0;  // pre-clip global norm; 0 when skipped
  bool clipped = false;
  std::shared_ptr<const ParamSnapshot> params;  // null when the trainer asked for none
};

using StepCallback = std::function<void(absl::StatusOr<StepOutcome>)>;

// A trainer that committed and waits for the outcome of the step.
struct StepWaiter {
  DType dtype = DType::kF32;
  bool want_params = true;
  StepCallback done;
  bool stream = false;      // StepBegin::stream_params
  bool owned_only = false;  // StepBegin::return_owned
  int trainer = -1;         // whose stream waits
};

// What one run of the coordinator does with the pending step.
enum class ResolutionKind {
  kApply,  // every contribution is in: step (or skip, when a gradient is not finite)
  kAbort,  // this rank votes to abort the step (deadline passed, or another rank voted so)
};

// The coordinator's view of the session whose steps it resolves (the Session implements it).
// Each call takes the session's lock itself: the coordinator calls them without any lock held.
class StepLedger {
 public:
  // The pending step as the coordinator starts to resolve it.
  struct Pending {
    uint64_t step = 0;                     // the step resolved: the last applied one + 1
    std::optional<StepSchedule> schedule;  // unset when no trainer began the step
    std::optional<absl::Time> began;       // when the first trainer began it
    int num_trainers = 0;
    std::vector<int> uncommitted;  // the trainers that had not committed it on this rank
    std::vector<int> not_begun;    // those of them that had not begun it on this rank
  };
  // What is left to tell once a step ended.
  struct Ended {
    uint64_t step = 0;  // the step that ended
    std::vector<StepWaiter> waiters;
  };

  virtual ~StepLedger() = default;
  // Waits until no gradient copy is in flight, then answers the pending step.
  virtual Pending BeginResolution() = 0;
  // The statistics computed during ingest of each gradient as it is now (GradientStatistics),
  // by parameter; unset where none were. REQUIRES: called from a task of the device worker
  // after BeginResolution, so that every statistics task posted during ingest has run.
  virtual std::vector<std::optional<GradientStatistics::Result>> IngestStatistics() = 0;
  // Takes the waiters that stream parameters (StepWaiter::stream with parameters wanted).
  virtual std::vector<StepWaiter> TakeStreamingWaiters() = 0;
  // The step applies (its result is agreed): the last step's snapshots are no longer served, so
  // that they are not kept beside this step's while it fills them; a reader that asks now waits
  // for this step's (Session::GetSnapshot builds on the coordinator, after the resolution).
  // Dropped outside the session's lock: a snapshot the coordinator's SnapshotPool made goes back
  // to it (others are freed) once no stream sends from it any more.
  virtual void ReleaseSnapshots() = 0;
  // A snapshot this step streams from: what streams that hold it after the session stepped on
  // cost is counted from now on (SnapshotRetention).
  virtual void TrackSnapshot(const std::shared_ptr<const ParamSnapshot>& snapshot) = 0;
  // The replica cannot be trusted any more (a collective or the optimizer failed).
  virtual void MarkBroken() = 0;
  // A peer was lost during `step` while the group keeps redundant state: the step is refused
  // until the group heals, then redone (StepBook::MarkInterrupted).
  virtual void MarkInterrupted(uint64_t step) = 0;
  // The step ended: when `outcome` is OK (applied or skipped) the counters advance and
  // outcome->step is set. Forgets the step's contributions; answers the waiters to notify.
  virtual Ended EndStep(absl::StatusOr<StepOutcome>& outcome) = 0;
  // The resolution is over; `snapshots` (null unless the step was applied or skipped) serve
  // later readers of the same step.
  virtual void EndResolution(
      const std::map<DType, std::shared_ptr<const ParamSnapshot>>* snapshots) = 0;
};

// One session's step coordinator on one rank: a thread of its own (a SerialExecutor) that runs
// the session's resolutions, snapshots and state replacements in order, and the only thread that
// waits on the session's collectives. Device math is posted from it to the session's queue of the
// engine's shared device worker, whose tasks never wait on anything, so a collective of one session
// never holds up another session's steps, on any rank. A step's device math goes in slices (about
// kDeviceSlice, or one batch of parameters' update when that is longer: owned_update.h), so that
// the worker takes another session's task between two of them; closing the queue (CancelDeviceWork)
// ends the step at the next slice.
//
// Thread-safe for Post; every other method runs on the coordinator's thread only. It reads and
// writes the replica's tensors there (see ReplicaState), and takes no lock of its own: the ledger
// takes the session's.
class StepCoordinator {
 public:
  // How long one task of a step's device math runs, at least one batch's update: what another
  // session's task waits for, at most, per session with work (docs/security.md).
  static constexpr absl::Duration kDeviceSlice = absl::Milliseconds(2);

  struct Options {
    std::string session_id;
    std::string owner;  // the device worker's turns are per owner (FairExecutor's groups)
    absl::Duration step_deadline;            // named in the abort message
    std::shared_ptr<StepObserver> observer;  // never null
    // State redundancy (shadow_state.h): the shadow of the predecessor's replica, kept current
    // in every step; must outlive the coordinator. Null: none (a lost peer breaks the session).
    ShadowState* shadow = nullptr;
  };

  // INTERNAL when `comm` does not span the replica's layout with the replica's rank.
  // `replica` and `ledger` must outlive the coordinator.
  static absl::StatusOr<std::unique_ptr<StepCoordinator>> Create(
      Options options, ReplicaState* replica, std::unique_ptr<Communicator> comm,
      std::shared_ptr<FairExecutor> device_worker, StepLedger* ledger);
  // Runs the tasks already posted, then joins the coordinator's thread.
  ~StepCoordinator() = default;

  StepCoordinator(const StepCoordinator&) = delete;
  StepCoordinator& operator=(const StepCoordinator&) = delete;

  // Runs `task` on the coordinator, after every task posted before it.
  void Post(std::function<void()> task);
  // Runs `task` on the device worker and waits for it; `what` names it for the watchdog.
  // UNAVAILABLE, without running it, once the device work is cancelled. REQUIRES: on the
  // coordinator.
  absl::Status OnDevice(const std::function<absl::Status()>& task,
                        absl::string_view what = "device work");
  // Queues `task` on the session's device work without waiting for it; `what` names it for the
  // watchdog. Dropped (never run) once the device work is cancelled. Any thread.
  void PostDevice(std::string what, std::function<void()> task);
  // Items whose inputs come in meanwhile: limit(next) blocks until item `next` may run and
  // answers how many items (from item 0) may run now.
  using SliceLimit = std::function<int(int next)>;
  // Runs item(0) .. item(count - 1) in order on the device worker, as tasks of about
  // kDeviceSlice each (at least one item; none past `limit`, when set), and waits for them;
  // stops at the first error. REQUIRES: on the coordinator.
  absl::Status OnDeviceSliced(absl::string_view what, int count,
                              const std::function<absl::Status(int)>& item,
                              const SliceLimit& limit = SliceLimit());
  // Every master this rank holds, converted to `dtype`, as the parameters of `step`: copied on
  // the device worker a slice at a time (OnDeviceSliced), so that the copy of a large session
  // holds another session's device work by one slice, not by all of it. REQUIRES: on the
  // coordinator, which alone writes the masters.
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BuildSnapshot(DType dtype, uint64_t step);
  // Drops the session's device work not yet started and refuses any later (OnDevice answers
  // UNAVAILABLE): a resolution that runs ends at its next slice. For Session::Close; any thread.
  void CancelDeviceWork() { device_queue_.Close(); }
  // Resolves the pending step: with kApply, averages, checks, agrees with the other ranks,
  // clips, steps and all-gathers; with kAbort, votes to abort it. Tells every waiter.
  // REQUIRES: on the coordinator.
  void Resolve(ResolutionKind kind);

 private:
  // The ranks' common decision after the local statistics.
  struct Agreement {
    bool abort = false;
    bool failed = false;   // some rank could not compute its statistics
    bool skipped = false;  // some gradient is not finite
    double grad_norm = 0.0;
  };
  // Snapshots handed to the trainers before the optimizer runs, filled as parameters are ready.
  using StreamingSnapshots = std::map<DType, std::shared_ptr<ParamSnapshot>>;

  StepCoordinator(Options options, ReplicaState* replica, std::unique_ptr<Communicator> comm,
                  std::shared_ptr<FairExecutor> device_worker, StepLedger* ledger);
  // This rank's part: the REPLICATED mean, per-parameter sums of squares and finiteness; those
  // computed during ingest (IngestStatistics) are taken as they are.
  absl::Status LocalStatistics(uint64_t step, std::vector<double>& sums, bool& finite);
  // One all-reduce carries the sums of squares and the skip, abort and failure votes.
  absl::StatusOr<Agreement> Agree(bool abort, bool failed, const std::vector<double>& sum_squares,
                                  bool finite);
  // Releases the last step's snapshots (StepLedger::ReleaseSnapshots), then hands `outcome`
  // (known once the ranks agreed) to the waiters that stream parameters, with snapshots that
  // ApplyStep fills, made by the pool (in the storage of the last step's, where no stream still
  // reads those); those waiters are not called again.
  StreamingSnapshots StreamEarly(const StepOutcome& outcome, uint64_t step);
  // Scales the gradients by `clip_scale` (when below 1), steps the owned parameters and
  // all-gathers (REPLICATED storage only); fills `streaming` bucket by bucket (a parameter this
  // rank owns once it is stepped, the others once gathered). The parameters written last are left
  // for FinishStep to mark ready: `*last_ids`. `started`: when Resolve began (the step phase is
  // reported up to the all-gather). A rank whose owned parameters already had this step's update (a
  // step redone after an interruption) does not apply it again. `shipment` (state redundancy,
  // else null): each batch steps once its gradients are out, and the shipment ends before the
  // all-gather. `*peer_lost`: the error is a lost peer's, not the device's.
  absl::Status ApplyStep(uint64_t step, const StepSchedule& schedule, double clip_scale,
                         absl::Time started, const StreamingSnapshots& streaming,
                         GradientShipment* shipment, std::vector<int>* last_ids, bool* peer_lost);
  // Starts shipping this rank's owned gradients to its buddy and receiving its predecessor's
  // into the shadow (GradientShipment), on shipper_.
  std::unique_ptr<GradientShipment> StartShipment();
  // The limit of `update`'s batches by what `shipment` sent (a batch reads its gradients only
  // once they are out).
  SliceLimit ShippedBatches(const OwnedUpdate& update, GradientShipment* shipment);
  // Ships this rank's owned masters to its buddy and receives its predecessor's into the
  // shadow, before the first update: the shadow then starts where its owner does, however the
  // owner's masters were set. Redone with step 1 (after a lost peer): ships the initial masters
  // kept in seed_masters_, and a shadow that took step 1 already drops what it receives.
  // UNAVAILABLE when a peer is lost.
  absl::Status SeedShadowMasters();
  // Steps the shadow as its owner stepped (unless it reflects `step` already, or is unusable),
  // once the step ended. A failure leaves the shadow unusable (ShadowState::Invalidate), logged.
  void UpdateShadow(uint64_t step, const StepSchedule& schedule, double clip_scale);
  // A peer was lost: with a shadow the step is interrupted (redone after the heal), otherwise
  // the replica is broken. Ends the step with `error`.
  void LostPeer(uint64_t step, absl::Status error);
  // Writes `ids` into every streaming snapshot and, with `mark`, marks them ready. On the
  // device worker.
  absl::Status PublishParams(const std::vector<int>& ids, const StreamingSnapshots& streaming,
                             bool mark = true);
  // Ends the step with `outcome` and tells every waiter. `streamed`: the snapshots StreamEarly
  // handed out, written but for marking `last_ids` ready, which FinishStep does once the step
  // counts as applied (a trainer that has every parameter may begin the next step at once).
  void FinishStep(absl::StatusOr<StepOutcome> outcome, bool aborted,
                  const StreamingSnapshots& streamed = {}, const std::vector<int>& last_ids = {});

  const Options options_;
  ReplicaState* const replica_;
  const std::unique_ptr<Communicator> comm_;
  // The session's queue of the device worker; closed when the coordinator is gone (after its
  // thread, declared below, is joined).
  FairQueue device_queue_;
  StepLedger* const ledger_;
  Tensor votes_;  // Agree's all-reduce buffer, in device memory (several ranks only)
  // This rank's owned masters as they were before step 1, from step 1's first seed until step
  // 1 ended here (SeedShadowMasters); undefined otherwise.
  Tensor seed_masters_;
  // The storage of the snapshots StreamEarly makes, recycled from step to step.
  SnapshotPool snapshots_;
  // The thread of the gradient shipments (state redundancy only, made at the first): each is
  // waited for within its step.
  std::unique_ptr<SerialExecutor> shipper_;
  // Declared last: destroyed (and joined) first, while what its tasks use still exists.
  SerialExecutor executor_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_STEP_COORDINATOR_H_
