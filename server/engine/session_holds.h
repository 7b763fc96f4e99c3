#ifndef OPTSTEP_SERVER_ENGINE_SESSION_HOLDS_H_
#define OPTSTEP_SERVER_ENGINE_SESSION_HOLDS_H_

// A session's held operations: the hold that stops every rank at one resolution
// (docs/checkpoints.md, "RPCs and consistency"), and the state dict read and written under it
// or, on one rank, between steps.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "checkpoint/state_dict.h"
#include "server/engine/replica_state_dict.h"

namespace optstep {

class Session;

// Where a held rank stands: the resolutions it finished and its counters.
struct HeldPoint {
  uint64_t resolutions = 0;
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
};

// The state dict surface of one Session (reached through Session::holds()): the hold, kept by
// the session's ResolutionGate, and the tensors of its ReplicaState read, staged and written
// while every rank is settled at the same resolution; ExportState / ImportState between steps
// when the session has one rank. The session's steps go on as before: a hold only defers the
// resolutions past its limit, and a staged state is written on the session's coordinator.
//
// Thread-safe. Part of its Session, which it reaches through the session's own lock (the same
// lock order: Session::mu_, then the gate's).
class SessionHolds {
 public:
  explicit SessionHolds(Session& session) : session_(session) {}

  SessionHolds(const SessionHolds&) = delete;
  SessionHolds& operator=(const SessionHolds&) = delete;

  // Hold: this rank starts no resolution beyond those it already started, and answers their
  // number. Every hold call renews the lease; when it passes without a call the hold ends by
  // itself (a crashed caller never wedges the session). ABORTED while another token holds the
  // session; UNAVAILABLE when closed or broken.
  absl::StatusOr<uint64_t> Hold(uint64_t token, absl::Duration lease);
  // Renews the lease of the hold of `token` (ResolutionGate::Renew): ABORTED once it is gone,
  // where Hold would take the session anew, unsettled, after resolutions ran. What a held
  // operation calls as it goes.
  absl::Status Renew(uint64_t token, absl::Duration lease);
  // Hold, waiting until `until` for another token's hold to end (released, or its lease passed)
  // instead of answering ABORTED at once: operations that meet each other (a trainer's state
  // dict import during an automatic checkpoint, two trainers' imports) run one after the other.
  // REQUIRES: the caller holds no lock of the session.
  absl::StatusOr<uint64_t> HoldWhenFree(uint64_t token, absl::Duration lease, absl::Time until);
  // Raises the hold's limit to `target`, then waits (until `deadline`) until this rank finished
  // exactly `target` resolutions. INVALID_ARGUMENT when this rank already started more;
  // DEADLINE_EXCEEDED; FAILED_PRECONDITION when `token` does not hold the session.
  absl::StatusOr<HeldPoint> Settle(uint64_t token, uint64_t target, absl::Time deadline,
                                   absl::Duration lease);
  // Ends the hold (and drops a staged state). OK when `token` holds nothing (idempotent).
  absl::Status Release(uint64_t token);
  // Ends a hold whose lease passed (called by the engine's watcher).
  void ExpireHold(absl::Time now);

  // While settled: this rank's tensors of `selection`, in key order (those a state staged for
  // the session must hold). To read their values, HeldTensorsToRead.
  absl::StatusOr<std::vector<HeldTensor>> HeldTensors(uint64_t token,
                                                      const StateSelection& selection);
  // As HeldTensors, once the state held is that of the step held: UNAVAILABLE while this rank's
  // update of a step a lost peer interrupted waits for the step's redo (a heal ended, the
  // trainers not back yet): its masters and state are then a step ahead of its counters, and
  // a checkpoint of them would apply that step twice once restored.
  absl::StatusOr<std::vector<HeldTensor>> HeldTensorsToRead(uint64_t token,
                                                            const StateSelection& selection);
  // While settled: the tensors of `selection` copied to the host (HeldTensorsToRead), the hold
  // renewed for `lease` after each (none when zero). ABORTED when the hold is gone once they are
  // copied (its lease passed: a step may have resolved while they were read, and the copy would
  // hold parts of two steps).
  absl::StatusOr<std::shared_ptr<const StateDict>> ExportHeld(
      uint64_t token, const StateSelection& selection, absl::Duration lease = absl::ZeroDuration());
  // While settled: validates `state` against this rank (INVALID_ARGUMENT naming the key, as
  // ImportState) and keeps it for ApplyStaged. With `complete`, every key of this rank's
  // default selection must be present (DATA_LOSS names the first missing one).
  absl::Status StageState(uint64_t token, std::shared_ptr<const StateDict> state, bool complete);
  // Writes the staged state on the coordinator; the pending step (if any) is aborted, so its
  // trainers redo it against the new state. FAILED_PRECONDITION when nothing is staged.
  absl::Status ApplyStaged(uint64_t token);

  // The state dict (masters, optimizer state, counters) as it was after the last step, for the
  // parameters of `model_chunks` (all when empty). `done` is called exactly once.
  // FAILED_PRECONDITION when the session spans several ranks (use a hold and ExportHeld).
  void ExportState(std::vector<uint32_t> model_chunks,
                   std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)> done);
  // Replaces masters, optimizer state and counters with the tensors of `state` (any subset of
  // the keys ExportState answers). Everything is validated before anything changes:
  // INVALID_ARGUMENT names an unknown key or a shape / type mismatch. FAILED_PRECONDITION while
  // a step is pending or on several ranks (use a hold and StageState). `done` is called exactly
  // once.
  void ImportState(std::shared_ptr<const StateDict> state, std::function<void(absl::Status)> done);

 private:
  // The session's StepBook::CheckUsable, then the gate's CheckSettled.
  absl::Status CheckSettled(uint64_t token) const;
  // HeldTensors, or HeldTensorsToRead when `to_read`.
  absl::StatusOr<std::vector<HeldTensor>> SelectHeld(uint64_t token,
                                                     const StateSelection& selection, bool to_read);
  // FAILED_PRECONDITION when the session spans several ranks: `verb` ("export", "import") its
  // state through a hold and `held` (the held call to use) instead.
  absl::Status CheckOneRank(absl::string_view verb, absl::string_view held) const;

  Session& session_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SESSION_HOLDS_H_
