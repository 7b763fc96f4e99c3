#ifndef OPTSTEP_SERVER_ENGINE_STEP_BOOK_H_
#define OPTSTEP_SERVER_ENGINE_STEP_BOOK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/dtype.h"
#include "server/engine/contribution_digest.h"
#include "server/engine/gradient_statistics.h"
#include "server/engine/param_snapshot.h"
#include "server/engine/replica_state_dict.h"
#include "server/engine/session_config.h"
#include "server/engine/step_contributions.h"
#include "server/engine/step_coordinator.h"
#include "server/engine/step_schedule.h"
#include "server/engine/trainer_order.h"

namespace optstep {

// What a trainer says when it starts its part of a step.
struct StepBegin {
  uint64_t step = 0;  // 1-based number of the step to apply
  int trainer = 0;
  std::map<int, GroupStepValues> schedules;  // by group id
  DType return_dtype = DType::kF32;
  bool return_params = true;
  // The caller can send parameters while the step still fills their snapshot
  // (ParamSnapshot::readiness): its commit's callback comes as soon as the ranks agree on the
  // result, before the optimizer runs. Otherwise it comes once the step is applied.
  bool stream_params = false;
  // REPLICATED storage: the caller is returned the parameters this rank owns only (the Step
  // header's return_owned), so its snapshot needs no others (ParamSnapshot::partial).
  bool return_owned = false;
};

// The record of one session's steps on one rank (docs/design.md §3): the pending step (the
// trainers' contributions and their order, the schedule, each trainer's attempt, the trainers
// that committed and wait, when the step began), the counters and the last outcome, the
// parameters published for the last step, and whether the session still takes steps (closed,
// broken, a resolution running). It decides what a trainer's Begin and Commit mean against that
// record (in sequence, a retry, a replay, stale; a retry or replay honoured only for the same
// contribution) and what ending or aborting the step leaves to tell. It calls no callback and
// touches no tensor: what it returns is told by its owner.
//
// Thread-compatible: it takes no lock. Its Session keeps it under Session::mu_ (ABSL_GUARDED_BY)
// and tells what it returns once that lock is released.
class StepBook {
 public:
  // `owned_numels[p]`: the elements of parameter p when this rank owns it, else 0 (coverage is
  // checked for the owned parameters only). `names` must outlive the book. `session_id` and
  // `rank` name the session in messages.
  StepBook(std::string session_id, int rank, const SessionConfig& config,
           std::vector<int64_t> owned_numels, const std::vector<std::string>* names);

  // UNAVAILABLE once closed or broken, and while interrupted.
  absl::Status CheckUsable() const;
  // CheckUsable; ABORTED when the step `c` belongs to was aborted or superseded since (a new
  // generation), or its trainer began the step again. A retry whose step was applied since
  // (AppliedSinceRetry) is fresh: it is a replay of that step now.
  absl::Status CheckFresh(const StepHandle& c) const;
  // Whether `c`, a retry (it began while its step was resolved, or after its trainer committed),
  // resends the step that has been applied since, the last one applied: the resolution it would
  // have waited for ended before its commit, which is then answered as a replay of that step.
  bool AppliedSinceRetry(const StepHandle& c) const;

  // The contribution `begin` starts, with `schedule` (begin's values over the defaults): a replay
  // of the last applied step; a retry while a resolution runs or once the trainer committed; or
  // a new attempt of the pending step, which forgets what the trainer sent before (see
  // StepContributions::DropTrainer), starts the step's clock at `now` when it is the first, and
  // appends the trainer's waiting chunks to `superseded` (to tell outside the lock). A replay or
  // retry digests its chunks (StepHandle::resent) for CheckResent.
  // INVALID_ARGUMENT: a schedule differing from another trainer's; FAILED_PRECONDITION: step out
  // of sequence (names the expected step), a replay or retry with a schedule other than the one
  // the step was (or is to be) applied with; UNAVAILABLE (CheckUsable).
  // REQUIRES: 0 <= begin.trainer < num_trainers.
  absl::StatusOr<StepHandle> Begin(const StepBegin& begin, StepSchedule schedule, absl::Time now,
                                   std::vector<WaitingChunk>* superseded);
  // Commits `c` (unless it is a retry, which committed before) and keeps `done` to tell the
  // outcome. INVALID_ARGUMENT for an element count other than `num_elements` (0: unchecked) or
  // missing coverage, FAILED_PRECONDITION for a REPLICATED resend whose elements carried over
  // from an earlier attempt have other values (SameResend): the trainer's contribution is
  // dropped and `done` with it. A retry is checked with CheckResent.
  // REQUIRES: CheckFresh(c) is OK and c is no replay.
  absl::Status Commit(const StepHandle& c, uint64_t num_elements, StepCallback done);
  // Takes the callbacks `trainer`'s committed streams wait on, whose place a retry of the
  // trainer takes (the trainer left them: a broken stream), to be told outside the lock.
  std::vector<StepCallback> TakeWaitersOf(int trainer);
  // A replay or retry is honoured only for the same contribution: OK when what `c` sent again
  // (c.resent) is what its trainer sent to the step that was applied (replay) or that it
  // committed (retry); FAILED_PRECONDITION naming the step and the trainer otherwise.
  // REQUIRES: c.replay or c.retry, CheckFresh(c) is OK.
  absl::Status CheckResent(const StepHandle& c) const;
  // Whether the pending step can be applied: every trainer committed, no resolution runs, and
  // the session is neither closed nor broken.
  bool ready_to_apply() const;
  // Whether the session is between steps: no resolution (or state replacement) runs and no
  // trainer sent anything for the pending step, so the state may be written from outside.
  bool between_steps() const { return !running_ && !contributions_.started(); }

  // The pending step as a resolution starts (StepLedger::BeginResolution).
  StepLedger::Pending pending() const;
  // Takes the waiters that stream parameters (StepLedger::TakeStreamingWaiters).
  std::vector<StepWaiter> TakeStreamingWaiters();
  // The step ended (StepLedger::EndStep): on OK the counters advance, outcome->step is set and
  // the outcome is kept for replays. The step is forgotten and the published parameters with
  // it; the chunks that still waited for their turn are appended to `stranded`.
  StepLedger::Ended EndStep(absl::StatusOr<StepOutcome>& outcome,
                            std::vector<WaitingChunk>* stranded);
  // Drops the pending step; returns the callbacks to tell why it ended (the waiting chunks'
  // among them).
  std::vector<StepCallback> Abort();
  // The counters of a state just written (WriteResolvedState): a new generation, and no
  // published parameters or replay of the state before; an interrupted step it includes is no
  // longer redone.
  void WriteCounters(const ResolvedState& resolved);

  // Refuses further steps; false when already closed. The pending step stays to be aborted.
  bool Close();
  // The replica cannot be trusted any more: refuses further steps.
  void MarkBroken();
  bool broken() const { return broken_; }
  // A peer was lost during step `step` while the group keeps redundant state (shadow_state.h):
  // steps are refused (UNAVAILABLE) until Resume, after the heal; the step is then redone. When
  // every trainer had committed it, their schedule and digests are kept until the step is
  // applied (or the state replaced): the ranks and shadows that applied it before the loss skip
  // its redo and the others apply the redo, so a redo of other values is refused
  // (FAILED_PRECONDITION), as a resend of a committed step is. Once a redo ends unapplied (its
  // deadline passed), the record lapses and any redo is taken.
  void MarkInterrupted(uint64_t step);
  void Resume() { interrupted_.reset(); }
  const std::optional<uint64_t>& interrupted() const { return interrupted_; }
  // Whether a resolution (or a state replacement) runs on the coordinator.
  bool running() const { return running_; }
  void set_running(bool running) { running_ = running; }

  // When the first trainer began the pending step; unset between steps.
  const std::optional<absl::Time>& step_began() const { return step_began_; }
  // Starts the pending step's clock at `now` unless it runs already.
  void StartClock(absl::Time now);
  // Restarts the pending step's clock at `now` if it runs (a heal ended: the trainers redo their
  // part of the step, which may have waited for the heal longer than the step's deadline).
  void RestartClock(absl::Time now);

  const StepCounters& counters() const { return counters_; }
  const std::optional<StepOutcome>& last_outcome() const { return last_outcome_; }
  // Changes when the pending step is forgotten (ended, aborted) or the state is replaced.
  uint64_t generation() const { return generation_; }
  StepContributions& contributions() { return contributions_; }
  TrainerOrder& order() { return order_; }
  const TrainerOrder& order() const { return order_; }
  // The writes into the gradient buffers and the statistics computed during ingest; forgotten
  // with the pending step (a new generation).
  GradientStatistics& statistics() { return statistics_; }
  // The parameters published for the last step, by dtype; cleared when the step or the state
  // changes.
  std::map<DType, std::shared_ptr<const ParamSnapshot>>& snapshots() { return snapshots_; }

 private:
  // OK when `difference` is empty; else FAILED_PRECONDITION: `c`'s step was already `done`
  // (applied, committed) with a different contribution from its trainer, which `difference`
  // names.
  absl::Status DifferentContribution(const StepHandle& c, absl::string_view done,
                                     const std::string& difference) const;
  // Forgets the pending step's contributions, schedule and start (a new generation); returns
  // the chunks that waited for their turn.
  std::vector<WaitingChunk> ResetStep();

  const std::string id_;
  const int rank_;
  StepContributions contributions_;
  TrainerOrder order_;
  GradientStatistics statistics_;
  std::optional<StepSchedule> schedule_;
  std::vector<uint64_t> attempts_;  // each trainer's last Begin
  std::vector<bool> began_;         // the trainers that began the pending step
  std::vector<StepWaiter> waiters_;
  std::map<DType, std::shared_ptr<const ParamSnapshot>> snapshots_;
  std::optional<StepOutcome> last_outcome_;
  // The last applied step's schedule and each trainer's digest of it, for its replays.
  StepSchedule applied_schedule_;
  std::vector<ContributionDigest> applied_digests_;
  std::optional<absl::Time> step_began_;
  StepCounters counters_;
  uint64_t generation_ = 0;
  bool running_ = false;
  bool closed_ = false;
  bool broken_ = false;
  std::optional<uint64_t> interrupted_;
  // What every trainer committed to a step a lost peer interrupted (MarkInterrupted).
  struct CommittedStep {
    uint64_t step = 0;
    StepSchedule schedule;
    std::vector<ContributionDigest> digests;  // per trainer
  };
  std::optional<CommittedStep> interrupted_commit_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_STEP_BOOK_H_
