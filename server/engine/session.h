#ifndef OPTSTEP_SERVER_ENGINE_SESSION_H_
#define OPTSTEP_SERVER_ENGINE_SESSION_H_

// One rank's part of a registered model (Session): the trainers' contributions to each step, the
// step contract of docs/design.md §3 and the collaborators that keep the tensors and resolve the
// steps; SessionStats are its counters.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/fair_executor.h"
#include "checkpoint/layout.h"
#include "checkpoint/state_dict.h"
#include "kernels/comm/communicator.h"
#include "kernels/device.h"
#include "server/engine/gradient_statistics.h"
#include "server/engine/memory_budget.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/replica_state.h"
#include "server/engine/resolution_gate.h"
#include "server/engine/session_config.h"
#include "server/engine/session_holds.h"
#include "server/engine/shadow_state.h"
#include "server/engine/snapshot_retention.h"
#include "server/engine/step_book.h"
#include "server/engine/step_contributions.h"
#include "server/engine/step_coordinator.h"
#include "server/engine/step_observer.h"
#include "server/engine/step_schedule.h"
#include "server/engine/trainer_order.h"

namespace optstep {

struct ResolvedState;  // replica_state_dict.h

using SnapshotCallback = std::function<void(absl::StatusOr<std::shared_ptr<const ParamSnapshot>>)>;

struct SessionStats {
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
  int64_t param_bytes = 0;
  int64_t state_bytes = 0;
  int64_t buffer_bytes = 0;  // gradient buffers and staging
  // State redundancy: the shadow of the predecessor's owned masters, optimizer state and gradient
  // buffers (ShadowBytes); 0 without one.
  int64_t shadow_bytes = 0;
  // A step (or a state replacement) is being resolved: `step` does not count it yet.
  bool step_running = false;
  // State replacements applied here (a checkpoint's Load, a state dict's import), whatever the
  // step they set: a session's timeline changes with each.
  uint64_t state_replacements = 0;
};

// One rank's part of a registered model and the step contract of docs/design.md §3 across the
// ranks of the session's communicator. The Session receives the trainers' contributions (Begin,
// AddGradient, Commit), writes their chunks into the gradient buffers, and hands the rest to its
// collaborators:
//   - StepBook: the record of the steps (the pending step's contributions, order, schedule,
//     attempts and waiters, the counters and the last outcome), under the session's lock;
//   - ReplicaState: the tensors (masters, optimizer state, gradient buffers) and the state dict;
//   - StepCoordinator: the coordinator thread that resolves each step (agree, apply, gather,
//     publish), calling back through the StepLedger the Session implements;
//   - ResolutionGate: the resolutions started and finished, and the hold for checkpoints;
//   - SessionHolds: the hold and the state dict surface (holds()), on the session's lock.
//
// Threads: stream handlers call Begin / AddGradient / Commit concurrently. Steps, aborts,
// snapshots and state replacements run in order on the coordinator, the only thread that waits on
// the session's collectives; device math is posted from there to the engine's shared device
// worker. Thread-safe.
//
// Lock order: Session::mu_ (which also guards the StepBook, itself lock-free), then
// ResolutionGate's lock (the gate is called under mu_, never the reverse); ParamReadiness and the
// executors' queues are leaves. No callback (waiters, chunks' `added`) is called with mu_ held,
// and the coordinator calls the ledger without any lock.
class Session : public std::enable_shared_from_this<Session>, private StepLedger {
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
    // Told about phase timings, bytes and step ends; may be null.
    std::shared_ptr<StepObserver> observer;
    // Told (resolution, step) when this rank votes to abort a step past its deadline, so that
    // the other ranks join the vote (JoinAbort), those that never saw the step too; may be null.
    std::function<void(uint64_t resolution, uint64_t step)> on_abort_vote;
    // State redundancy (shadow_state.h; several ranks only): this rank keeps a shadow of its
    // predecessor's replica, and a peer lost in a step interrupts the session instead of
    // breaking it.
    bool state_redundancy = false;
    // Takes the bytes of a snapshot that streams hold beyond its headroom after the session
    // stepped on (snapshot_retention.h); null: nothing is charged or let go.
    SnapshotRetention::Reserve reserve_held_snapshot;
  };

  // Routes parameters, creates the group optimizers and allocates every tensor.
  // INVALID_ARGUMENT for invalid chains (naming the parameter); RESOURCE_EXHAUSTED over max_bytes.
  // The session shares ownership of the device and the device worker, so that both outlive it
  // (a session can be released after the engine, by its own coordinator's last task).
  static absl::StatusOr<std::shared_ptr<Session>> Create(Options options,
                                                         std::shared_ptr<Device> device,
                                                         std::shared_ptr<FairExecutor> worker);
  ~Session() override;

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  int rank() const { return replica_->rank(); }
  const SessionConfig& config() const { return replica_->config(); }
  const Layout& layout() const { return replica_->layout(); }
  const std::vector<GroupRuntime>& groups() const { return replica_->groups(); }
  SessionStats stats() const;
  // The state replacements applied after the first `seen` (SessionStats::state_replacements):
  // how many there are in all now, and the lowest step they set (none when there are no more
  // than `seen`). Of more than kKeptReplacements since, it may answer a lower step, never a
  // higher one.
  struct Replacements {
    uint64_t count = 0;
    std::optional<uint64_t> lowest_step;
  };
  Replacements ReplacementsSince(uint64_t seen) const;
  static constexpr size_t kKeptReplacements = 64;

  // INVALID_ARGUMENT naming the session and its trainers unless 0 <= trainer < num_trainers.
  absl::Status CheckTrainer(int trainer) const;

  // Starts (or resumes) `begin.trainer`'s part of step `begin.step`.
  // INVALID_ARGUMENT: trainer out of range, unknown group, invalid lr/weight decay, schedule
  // differing from another trainer's; FAILED_PRECONDITION: step out of sequence (names the
  // expected step); UNAVAILABLE: session closed.
  absl::StatusOr<StepHandle> Begin(const StepBegin& begin);

  // Where AddGradient put a chunk.
  enum class ChunkFate { kAdded, kWaiting };
  // Adds a gradient chunk (`pieces`: raw elements of `dtype`, views of received network buffers
  // split anywhere, even inside an element) to the step's buffer: copied once, straight from the
  // pieces. REPLICATED with several trainers, trainer t's chunk of a parameter is summed only
  // after trainers 0..t-1 sent all of it (TrainerOrder), so that one buffer sums in trainer
  // order. A chunk that comes earlier waits: kWaiting is answered, `keep` (which owns the bytes
  // of `pieces`) is held, and `added` is called exactly once, on the thread that lets the chunk
  // in, with the status of adding it (ABORTED when the step ends or the trainer begins again
  // first). The caller sends nothing more for the contribution until then.
  // NOT_FOUND: unknown param_id; INVALID_ARGUMENT: byte length, range, overlap, duplicate;
  // ABORTED: the contribution is stale.
  absl::StatusOr<ChunkFate> AddGradient(const StepHandle& c, int param_id, int64_t offset,
                                        DType dtype, absl::Span<const absl::string_view> pieces,
                                        std::shared_ptr<const void> keep,
                                        std::function<void(absl::Status)> added);
  // Whether a chunk of `c` for `param_id` would wait now (AddGradient's kWaiting), so that a
  // caller can first take what it holds while it waits. Within a step the turn only moves on:
  // a chunk found not to wait does not. False for a param_id AddGradient refuses.
  bool WouldWait(const StepHandle& c, int param_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // In-process forms, for callers that cannot pause: a chunk that must wait is copied and kept
  // by the session (an error in adding it later shows at Commit as elements missing).
  absl::Status AddGradient(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                           const void* data, size_t bytes);
  absl::Status AddGradient(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                           absl::Span<const absl::string_view> pieces);

  // Commits the contribution. On OK, `done` is called exactly once (possibly on another thread,
  // possibly before Commit returns) with the outcome of the step, or with ABORTED when the step is
  // aborted. On error `done` is never called: INVALID_ARGUMENT for missing coverage (a chunk that
  // still waits for its turn is missing) or an element count mismatch (the trainer's
  // contribution is dropped; it should resend), ABORTED when stale.
  absl::Status Commit(const StepHandle& c, uint64_t num_elements, StepCallback done);

  using DoneCallback = std::function<void(absl::Status)>;
  // Initial values of several ranges, all or none: every piece is checked (NOT_FOUND: unknown
  // param_id; INVALID_ARGUMENT: byte length, range, a non-finite value) before any is written,
  // and all are written on the coordinator, which alone writes the masters otherwise (so that a
  // snapshot or an export, made there too, holds all of them or none), a piece at a time.
  // FAILED_PRECONDITION once a step has begun, or once step 1 was applied here before a lost peer
  // interrupted it; UNAVAILABLE while the group heals or a checkpoint holds the session
  // (CheckInitTakenLocked); CANCELLED, with nothing written, once `abandoned` (may be null; asked
  // on the coordinator) says the caller is gone. `done` is called exactly once, possibly on another
  // thread and before this returns; the pieces' data must stay valid until then.
  struct InitPiece {
    int param_id = 0;
    int64_t offset = 0;
    DType dtype = DType::kF32;
    absl::string_view data;
  };
  void InitValues(std::vector<InitPiece> pieces, DoneCallback done,
                  std::function<bool()> abandoned = nullptr);
  // The same, waiting for `done`. Never call it on the coordinator (a session's callback).
  absl::Status InitValues(absl::Span<const InitPiece> pieces);
  // Of one range.
  absl::Status InitValues(int param_id, int64_t offset, DType dtype, const void* data,
                          size_t bytes);
  // The checks InitValues makes of one piece, without writing: its element count, or the error
  // (FAILED_PRECONDITION too once a step was applied).
  absl::StatusOr<int64_t> CheckInitPiece(const InitPiece& piece) const ABSL_LOCKS_EXCLUDED(mu_);

  // The parameters after the last step, in `dtype`. `done` is called exactly once. UNAVAILABLE
  // while this rank's masters are not those of the last step: a step failed part way (broken),
  // or one interrupted by a lost peer after this rank's update awaits its redo.
  void GetSnapshot(DType dtype, SnapshotCallback done);

  // The hold and the state dict: Hold / Settle / Release, the held tensors, and state dicts
  // exported and imported (SessionHolds).
  SessionHolds& holds() { return holds_; }

  // Aborts the pending step on every rank when it began more than the step deadline before
  // `now` (through the session's collective, so that all ranks abort together).
  void AbortIfExpired(absl::Time now);
  // Another rank voted to abort `step` as its resolution `resolution`: this rank starts that
  // resolution too, voting to abort, unless it already started it (or a hold forbids it).
  void JoinAbort(uint64_t resolution, uint64_t step);
  // Aborts the pending step, refuses further steps (UNAVAILABLE) and cancels the session's device
  // work: what is queued is dropped, and a step that runs ends at its next slice (its trainers
  // are told UNAVAILABLE). Returns without waiting for it.
  void Close();
  // False once a collective failed (a peer was lost): the session answers UNAVAILABLE. With state
  // redundancy the session is only interrupted (interrupted_step()), and healthy again once
  // resumed after the heal.
  bool healthy() const;
  // Whether the session's group is lost for it (a collective failed without state redundancy),
  // and the step a lost peer interrupted, read at one moment: read one after the other, a heal
  // that resumed the session between the two reads showed it unhealthy with no step
  // interrupted, which reads as a lost group.
  struct Health {
    bool broken = false;
    std::optional<uint64_t> interrupted;
    bool healthy() const { return !broken && !interrupted.has_value(); }
  };
  Health health() const;
  // Whether a step has begun (a trainer sent its header) and has not finished yet.
  bool step_pending() const;

  // --- State redundancy (shadow_state.h: the heal's interface; session_redundancy.cc) ---
  using StateCallback = std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)>;
  // The step a lost peer interrupted (steps are refused until ResumeAfterHeal); unset otherwise.
  std::optional<uint64_t> interrupted_step() const;
  // This rank's owned masters, their optimizer state and the group counters, "meta/step" the
  // last step applied to them. Runs on the coordinator, after the resolution in progress.
  void ExportOwnedState(StateCallback done);
  // The shadow of the predecessor's: the same of its state, as of the shadow's step.
  // FAILED_PRECONDITION without a shadow or when an update of it failed.
  void ExportShadow(StateCallback done);
  // Every master, and the step counters ("meta/step", "meta/skipped_steps") of this rank.
  void ExportMasters(StateCallback done);
  // Writes what ExportOwnedState / ExportShadow answered into this rank's own part, or into its
  // shadow; what ExportMasters answered into its masters, with the step counters (a new
  // generation: no replay of the step before). FAILED_PRECONDITION while a step is pending (but
  // for the shadow, which no trainer's contribution touches); INVALID_ARGUMENT (nothing
  // written) for a key that does not fit. ImportMasters first:
  // ImportOwnedState then overwrites this rank's block with its own masters. Masters a step
  // ahead of the counters they come with (StepCounters::masters_step: the peer's own took the
  // step a lost rank interrupted) are not answered to pulls until the counters reach them.
  void ImportOwnedState(std::shared_ptr<const StateDict> state, DoneCallback done);
  void ImportShadow(std::shared_ptr<const StateDict> state, DoneCallback done);
  void ImportMasters(std::shared_ptr<const StateDict> state, DoneCallback done);
  // A heal's catch-up (heal.h, kCatchUp): ImportMasters of a peer's masters one step ahead of
  // this rank, taken only where this rank's own part needs nothing of that step: its update of
  // the step applied (before a lost peer cut the step here, or in the shadow a healed rank took
  // its state from), or the step was skipped. Else FAILED_PRECONDITION naming the steps, and
  // nothing written: the masters and counters taken would leave this rank's optimizer state at
  // another step (a state import cut part way leaves ranks a step apart too).
  void CatchUp(std::shared_ptr<const StateDict> masters, DoneCallback done);
  // A heal into `generation` begins (RankGroup::Regroup kBegin): no resolution starts until
  // ResumeAfterHeal or CancelHealPause of that generation, and this waits for a running one to
  // end, on the communicator it began on (the heal then rebuilds it; a resolution begun after
  // the rebuild would wait for ranks that never join it). DEADLINE_EXCEEDED naming the session
  // when one still runs at `deadline`. A heal whose end this session has had (the coordinating
  // rank gave up on this one's answer while it waited on another session) pauses nothing: no
  // end would come to resume it.
  absl::Status PauseForHeal(uint64_t generation, absl::Time deadline);
  // The heal into `generation` failed: resolutions start again as before it (an interrupted step
  // stays so).
  void CancelHealPause(uint64_t generation);
  // The group healed into `generation` (the communicator reconnected): steps are taken again,
  // the interrupted one redone, a step that became ready meanwhile resolved. The end of a heal
  // older than the one that paused the session (it came late) lifts nothing, as for
  // CancelHealPause.
  void ResumeAfterHeal(uint64_t generation);
  // A replica healed into a running group (its state is imported next, under a hold): counts
  // `resolutions` as done, the other ranks' count. FAILED_PRECONDITION once a step began here.
  absl::Status AdoptResolutions(uint64_t resolutions);
  // The heal ended (RankGroup::Regroup kEnd): counts the group's `resolutions`, rank 0's, as its
  // own (ResolutionGate::Rebase).
  void RebaseResolutions(uint64_t resolutions);
  // The resolutions this rank started (what a healed replica adopts).
  uint64_t resolutions_started() const { return gate_.started(); }

  // Keeps `reservation` (the replica's admitted bytes) until the session is destroyed, after
  // everything it holds was freed: a session closed while a call still holds it keeps counting
  // against the rank's budget and its owner's share. Called once, before the session is shared.
  void HoldReservation(MemoryBudget::Reservation reservation) {
    reservation_ = std::move(reservation);
  }

 private:
  friend class SessionHolds;  // the held operations read and write the step state under mu_

  Session(const Options& options, std::unique_ptr<ReplicaState> replica);

  // Records a chunk's ranges and writes (trainer 0, SHARDED) or adds (REPLICATED trainers > 0)
  // its fresh elements; when that completes the trainer's part of the parameter, adds the chunks
  // of the next trainer that waited for it, telling each its status.
  absl::Status WriteChunk(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                          absl::Span<const absl::string_view> pieces) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the statistics of `version` of `param`'s gradient, complete now, on the device worker
  // (ComputeStatistics), while the ingest of the others goes on.
  void PostStatisticsLocked(int param, uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The statistics task: MeanAndStatistics of the buffer unless it changed since it was posted
  // in `generation` (or is being written), recorded unless the step ended meanwhile. On the
  // device worker.
  void ComputeStatistics(int param, uint64_t generation, uint64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a resolution of `kind` on the coordinator unless a hold forbids it, and kApply only
  // when the book is ready_to_apply (every trainer committed, none runs); returns whether it did.
  bool StartResolutionLocked(ResolutionKind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heal paused the session and has not ended here.
  bool HealPausedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return heal_paused_for_ > heals_ended_;
  }
  // OK when a snapshot built now holds the parameters of `step` (the counters' step); else why
  // not (GetSnapshot, and the held state read by SessionHolds::HeldTensorsToRead). On the
  // coordinator, which alone writes the masters and their step, or under a settled hold.
  absl::Status CheckMastersAtStepLocked(uint64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION: initial values come after the session's first step (at `step`).
  absl::Status InitAfterFirstStepError(uint64_t step) const;
  // FAILED_PRECONDITION once step 1 was applied, or its part on this rank before a lost peer
  // interrupted it (its own parameters, or its shadow): initial values are never taken again.
  absl::Status StepOneAppliedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when initial values may be written now: StepOneAppliedLocked, no heal pauses the session,
  // no interrupted step waits for its redo, no state is being written (state_writes_) and no
  // step began; else UNAVAILABLE (they may be sent again once the group serves) or
  // FAILED_PRECONDITION.
  absl::Status CheckInitTakenLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InitValues on the coordinator, once CheckInitTakenLocked took them: writes the values
  // (`counts` elements each), counted in init_writes_.
  absl::Status WriteInitValues(const std::vector<InitPiece>& pieces,
                               const std::vector<int64_t>& counts) ABSL_LOCKS_EXCLUDED(mu_);
  bool NoInitWritesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return init_writes_ == 0; }
  // Whether a chunk of `c` for `param_id` waits for the trainers before it (AddGradient's
  // kWaiting; WouldWait).
  bool WaitsForTurnLocked(const StepHandle& c, int param_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The snapshot of `dtype` the last step published, or null.
  std::shared_ptr<const ParamSnapshot> PublishedLocked(DType dtype)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `read` on the coordinator's device work and answers its state dict.
  void ExportOnCoordinator(std::function<absl::StatusOr<std::shared_ptr<const StateDict>>()> read,
                           StateCallback done);
  // Runs `write` on the coordinator's device work between steps (FAILED_PRECONDITION while one
  // is pending), no step starting meanwhile; `then` under the lock on success.
  void ImportOnCoordinator(std::function<absl::Status()> write, std::function<void()> then,
                           DoneCallback done);
  // CatchUp's condition on `peer`, the resolved masters of a peer (on the coordinator).
  absl::Status CheckCatchUp(const ResolvedState& peer) const ABSL_LOCKS_EXCLUDED(mu_);

  // StepLedger, for the coordinator.
  Pending BeginResolution() override ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::optional<GradientStatistics::Result>> IngestStatistics() override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<StepWaiter> TakeStreamingWaiters() override ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseSnapshots() override ABSL_LOCKS_EXCLUDED(mu_);
  void MarkBroken() override ABSL_LOCKS_EXCLUDED(mu_);
  void MarkInterrupted(uint64_t step) override ABSL_LOCKS_EXCLUDED(mu_);
  Ended EndStep(absl::StatusOr<StepOutcome>& outcome) override ABSL_LOCKS_EXCLUDED(mu_);
  void EndResolution(const std::map<DType, std::shared_ptr<const ParamSnapshot>>* snapshots)
      override ABSL_LOCKS_EXCLUDED(mu_);
  void TrackSnapshot(const std::shared_ptr<const ParamSnapshot>& snapshot) override {
    retention_.Track(snapshot);
  }

  // Declared first, so released last (HoldReservation).
  MemoryBudget::Reservation reservation_;
  const std::string id_;
  const absl::Duration step_deadline_;
  const std::shared_ptr<StepObserver> observer_;  // never null (a no-op one by default)
  const std::function<void(uint64_t, uint64_t)> on_abort_vote_;
  const bool ordered_;  // SumsInTrainerOrder: chunks are added in trainer order
  // Fixed after Create; see ReplicaState for who touches the tensors when.
  const std::unique_ptr<ReplicaState> replica_;
  ResolutionGate gate_;
  SessionHolds holds_{*this};
  SnapshotRetention retention_;
  // Set once by Create (state redundancy only); touched on the coordinator.
  std::unique_ptr<ShadowState> shadow_;
  // Set once by Create; reset first by the destructor.
  std::unique_ptr<StepCoordinator> coordinator_;

  mutable absl::Mutex mu_;
  StepBook book_ ABSL_GUARDED_BY(mu_);
  // The newest heal (generation) that paused the session, and the newest whose end came here:
  // no resolution starts while the one is newer than the other.
  uint64_t heal_paused_for_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t heals_ended_ ABSL_GUARDED_BY(mu_) = 0;
  int inflight_copies_ ABSL_GUARDED_BY(mu_) = 0;       // gradient copies outside the lock
  std::vector<int> inflight_of_ ABSL_GUARDED_BY(mu_);  // the same by trainer
  // How long a trainer's new attempt waits for the copies of its earlier streams (Begin, on a
  // stream's thread): a copy takes milliseconds; one that takes seconds is a stalled device.
  static constexpr absl::Duration kEarlierCopiesWait = absl::Seconds(5);
  // State written on the coordinator outside a resolution, and without marking the book as
  // running (ImportShadow, a Load's SessionHolds::ApplyStaged), each within one task: initial
  // values, written on the coordinator too, never meet it, but their checks on the call's
  // thread (CheckInitPiece) read no step counter of the state while it is written.
  int state_writes_ ABSL_GUARDED_BY(mu_) = 0;
  // Initial values being written on the coordinator, outside the lock (0 or 1): a held
  // operation, which reads the masters from its own thread, settles once they are written.
  int init_writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t state_replacements_ ABSL_GUARDED_BY(mu_) = 0;  // SessionStats::state_replacements
  // The steps the last kKeptReplacements replacements set, the newest last, and the lowest of
  // those let go from it.
  std::deque<uint64_t> replaced_to_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> lowest_let_go_ ABSL_GUARDED_BY(mu_);
  // The step of the masters a heal took from a peer whose own had taken the step a lost rank
  // interrupted (StepCounters::masters_step): until the counters reach it, some masters here
  // are a step ahead of them (CheckMastersAtStepLocked).
  std::optional<uint64_t> masters_ahead_to_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SESSION_H_
