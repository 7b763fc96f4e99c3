#ifndef OPTSTEP_CLIENT_CPP_STEP_RECOVERY_H_
#define OPTSTEP_CLIENT_CPP_STEP_RECOVERY_H_

// Steps that survive a recovering server group (docs/api.md, "When the group recovers"). A
// group that loses a rank restarts as a whole and restores every session from its newest
// automatic checkpoint, with the same ids. A step that fails meanwhile (UNAVAILABLE; a broken
// stream while rank 0 is not serving) keeps its gradients: StepRecovery waits for the group with
// exponential backoff for at most ClientOptions::recovery_timeout, reads the session again and
// then redoes the step with the same bytes (the session is at the step before it), answers the
// step's result (the session applied it: the server's replay, else the restored parameters), or
// answers ABORTED carrying the restored step (RewindStep) when the session came back older:
// only the training loop can redo those steps, from its data.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/client_types.h"

namespace optstep {

// The restored step when `status` is a Step's answer that the session was rolled back to an
// older step (ABORTED with the payload kRewindPayload); steps up to it are applied and the next
// one to compute is that step + 1. nullopt for any other status.
std::optional<uint64_t> RewindStep(const absl::Status& status);

// The type URL of the payload RewindStep reads: the restored step in decimal.
inline constexpr absl::string_view kRewindPayload = "type.optstep.dev/optstep.RewindStep";

namespace client_internal {

// A session's step as rank 0 reads it, and whether a step is being resolved there (its
// parameters may be back with the trainers before it ends and `step` counts it).
struct SessionStep {
  uint64_t step = 0;
  bool running = false;
};

// What recovery asks of the group: whether rank 0 serves, and a session's current step. Each
// answers by `deadline` (its calls cut there), so that a recovery ends within its timeout also
// where hosts drop packets and every call would wait its whole rpc_timeout.
struct GroupProbe {
  std::function<absl::StatusOr<bool>(absl::Time deadline)> serving;
  std::function<absl::StatusOr<SessionStep>(absl::string_view session_id, absl::Time deadline)>
      session_step;
};

// Thread-safe: Run may be called from several threads at once.
class StepRecovery {
 public:
  // `timeout` zero answers every error at once. `sleep` waits (tests pass another).
  explicit StepRecovery(absl::Duration timeout,
                        std::function<void(absl::Duration)> sleep = absl::SleepFor);

  // Runs `attempt` (step `step` of `session_id` from trainer `trainer_id`, the same bytes each
  // time) until it is answered, waiting out a recovering group as the header says;
  // `applied(by)` answers a step the session applied but can no longer replay, its calls ended
  // by `by` (the recovery's deadline, or 30 s from the pull's start where that is later).
  absl::StatusOr<StepReply> Run(absl::string_view session_id, uint32_t trainer_id, uint64_t step,
                                const GroupProbe& probe,
                                absl::FunctionRef<absl::StatusOr<StepReply>()> attempt,
                                absl::FunctionRef<absl::StatusOr<StepReply>(absl::Time)> applied);

  // Runs `attempt`, a call that may be made again as it is (initial values before step 1),
  // until it answers anything but UNAVAILABLE (a group that heals refuses it meanwhile, having
  // done nothing), backing off as Run does, within the timeout: its last answer past it.
  absl::Status RunWhileUnavailable(absl::FunctionRef<absl::Status()> attempt) const;

  // Step `step` of the session was applied for trainer `trainer_id` (by a step that did not go
  // through Run: a StepStream's), so that a later step answered out of sequence is told apart
  // from a restore.
  void Note(absl::string_view session_id, uint32_t trainer_id, uint64_t step);
  // The session's state was replaced at `step` (a Load, an import): the steps its trainers saw
  // applied before no longer count. Past them, a step refused out of sequence would be taken
  // for a restore of the group (a rewind) instead of the caller's mistake. With `trainer_id`,
  // for that trainer alone: it learned of a restore itself (a pull), which the others are still
  // to be told of as a rewind.
  void Restart(absl::string_view session_id, uint64_t step,
               std::optional<uint32_t> trainer_id = std::nullopt);

 private:
  using TrainerKey = std::pair<std::string, uint32_t>;

  // `applied(by)` (the parameters of `step`, which the session applied), tried again while it
  // fails for a recovering reason (a rank still healing in, one lost during the pull) until
  // `by`: the step stands, and the trainer must not be told it failed. Parameters of an earlier
  // step (the group restored meanwhile) are a rewind to it.
  absl::StatusOr<StepReply> AppliedBy(
      const TrainerKey& key, uint64_t step, const GroupProbe& probe,
      absl::FunctionRef<absl::StatusOr<StepReply>(absl::Time)> applied, absl::Time by);
  bool Recovering(const GroupProbe& probe, const absl::Status& error, absl::Time by) const;
  // Whether rank 0 does not serve now: it answers so, or does not answer by `by`.
  bool NotServing(const GroupProbe& probe, absl::Time by) const;
  // Waits, backing off from `*wait`, until rank 0 serves; answers the session's step, or
  // `error` (naming the timeout) past `deadline`.
  absl::StatusOr<SessionStep> AwaitGroup(const GroupProbe& probe, absl::string_view session_id,
                                         absl::Time deadline, absl::Duration* wait,
                                         const absl::Status& error) const;
  // The session's step `now`, or, while it is below the last step this client saw applied and a
  // step runs (that step's parameters come back before the ranks ended it), the step once that
  // ended, polling for at most 30 s. A session restored to an older step runs none. The error of
  // a read that fails, DEADLINE_EXCEEDED past `by` (never a stale step, which would read as a
  // restore).
  absl::StatusOr<uint64_t> AwaitSeenStep(const GroupProbe& probe, const std::string& session_id,
                                         uint64_t seen, SessionStep now, absl::Time by);
  // One trainer of one session: trainers that share this client (several threads) each keep the
  // last step they saw applied, so that one's rewind does not hide the restore from another.
  uint64_t AppliedStep(const TrainerKey& key);
  absl::Status Rewind(const TrainerKey& key, uint64_t restored, uint64_t step);

  const absl::Duration timeout_;
  const std::function<void(absl::Duration)> sleep_;
  absl::Mutex mu_;
  // The last step each trainer of each session was seen to apply.
  absl::flat_hash_map<TrainerKey, uint64_t> applied_ ABSL_GUARDED_BY(mu_);
};

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_STEP_RECOVERY_H_
