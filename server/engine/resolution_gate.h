#ifndef OPTSTEP_SERVER_ENGINE_RESOLUTION_GATE_H_
#define OPTSTEP_SERVER_ENGINE_RESOLUTION_GATE_H_

// The resolutions of one session on one rank, and the hold that stops them at a point every rank
// agrees on (docs/checkpoints.md, "RPCs and consistency").
//
// A resolution is one run of the step coordinator: a step applied, skipped or aborted. Whatever
// its kind, the coordinator meets its peers in one all-reduce (and, for an applied step, one
// all-gather), so resolution k of one rank meets resolution k of every other rank; a rank that
// stopped resolving while a peer is inside resolution k would leave that peer in its collective.
// So a hold only stops the resolutions that no rank has begun yet: it settles at the number the
// caller saw as the largest on any rank.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstep {

struct ResolvedState;  // replica_state_dict.h

// Counts the resolutions a session started and finished, and holds them: while a hold is on, no
// resolution starts beyond the hold's limit. A hold lasts as long as its lease is renewed; once
// settled (every resolution up to its limit finished) it may keep a staged state to apply.
//
// Thread-safe. Lock order: the Session calls it with its own lock held (Session::mu_, then this
// one); the gate calls nothing outside itself under its lock. Whether the session is usable
// (closed, broken) is the session's to check first; Stop() only ends the waits.
class ResolutionGate {
 public:
  // `session_id` and `rank` name the session in messages.
  ResolutionGate(std::string session_id, int rank);

  ResolutionGate(const ResolutionGate&) = delete;
  ResolutionGate& operator=(const ResolutionGate&) = delete;

  // Counts a resolution as started unless the hold forbids it; answers whether it did.
  bool TryStart();
  // Whether TryStart would start a resolution now.
  bool may_start() const;
  uint64_t started() const;
  // The coordinator finished a resolution.
  void Finish();
  // The session closed or broke: waits in AwaitSettled end now, and later ones at once.
  void Stop();
  // A replica healed into a running group counts `resolutions` as started and finished, the
  // other ranks' count. FAILED_PRECONDITION once a resolution started or while held.
  absl::Status Adopt(uint64_t resolutions);
  // A heal ended: counts `resolutions` as started (and finished), the group's common count. The
  // ranks' counts drift apart when a loss cuts a resolution on some ranks and not on others, and
  // a hold settles every rank at one count. A resolution running here or a hold keep their
  // places relative to it.
  void Rebase(uint64_t resolutions);

  bool held() const;
  // Takes the hold for `token` (or renews it) until now + `lease`, with the resolutions started
  // so far as its limit; answers that number. ABORTED while another token holds it and its
  // lease has not passed (a passed one is taken over).
  absl::StatusOr<uint64_t> Hold(uint64_t token, absl::Duration lease);
  // Extends the hold of `token` to at least now + `lease` (never shortens it). ABORTED when
  // `token` holds the gate no more (its lease passed, and resolutions may have run since):
  // unlike Hold, never takes the gate anew.
  absl::Status Renew(uint64_t token, absl::Duration lease);
  // Waits until no token other than `token` holds the gate (released, expired or Stop()), or
  // until `until`; Hold may still find it taken by a third token in between.
  void AwaitFree(uint64_t token, absl::Time until);
  // Raises the limit to `target`; the lease runs until `lease` after the later of `deadline`
  // and now. FAILED_PRECONDITION when `token` does not hold; INVALID_ARGUMENT when more than
  // `target` resolutions already started.
  absl::Status Raise(uint64_t token, uint64_t target, absl::Time deadline, absl::Duration lease);
  // Waits until `target` resolutions finished, the hold of `token` ended or Stop() was called.
  // DEADLINE_EXCEEDED when none happened by `deadline`.
  absl::Status AwaitSettled(uint64_t token, uint64_t target, absl::Time deadline);
  // Marks the hold of `token` settled; answers the resolutions finished.
  // FAILED_PRECONDITION when `token` does not hold.
  absl::StatusOr<uint64_t> Settle(uint64_t token);
  // FAILED_PRECONDITION unless `token` holds (and, for CheckSettled, has settled).
  absl::Status CheckHolder(uint64_t token) const;
  absl::Status CheckSettled(uint64_t token) const;
  // Ends the hold of `token` (dropping its staged state); answers whether one ended.
  bool Release(uint64_t token);
  // Ends a hold whose lease passed before `now`; answers whether one ended.
  bool Expire(absl::Time now);

  // Keeps `staged` with the settled hold of `token` (CheckSettled's errors), replacing any.
  absl::Status Stage(uint64_t token, std::shared_ptr<ResolvedState> staged);
  // Takes the state staged under `token`: CheckSettled's errors, FAILED_PRECONDITION when none.
  absl::StatusOr<std::shared_ptr<ResolvedState>> TakeStaged(uint64_t token);

 private:
  // No default member initializers: clang would not see it as default-constructible inside
  // the class (std::optional<HoldState> below); Hold sets every field.
  struct HoldState {
    uint64_t token;
    uint64_t limit;  // resolutions this rank may start
    absl::Time expires;
    bool settled;
    std::shared_ptr<ResolvedState> staged;
  };

  bool MayStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No token but `token` holds the gate (or it stopped).
  bool FreeForLocked(uint64_t token) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckHolderLocked(uint64_t token) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSettledLocked(uint64_t token) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string session_id_;
  const int rank_;

  mutable absl::Mutex mu_;
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<HoldState> hold_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_RESOLUTION_GATE_H_
