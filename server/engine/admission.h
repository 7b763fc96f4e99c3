#ifndef OPTSTEP_SERVER_ENGINE_ADMISSION_H_
#define OPTSTEP_SERVER_ENGINE_ADMISSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/layout.h"
#include "server/engine/footprint.h"
#include "server/engine/memory_budget.h"
#include "server/engine/session_config.h"

namespace optstep {

// Admission control of one rank (docs/security.md "Limits"): a session's replica is admitted only
// when its footprint (footprint.h), computed from the definition before anything is allocated,
// is within the per-session cap and fits beside what the rank has admitted.
//
// Thread-safe.
class SessionAdmission {
 public:
  // `budget_bytes` > 0: the rank's budget; `max_session_bytes` > 0 caps one session (0: the
  // budget alone).
  // `state_redundancy`: every replica also holds a shadow (ComputeFootprint).
  SessionAdmission(int64_t budget_bytes, int64_t max_session_bytes, int rank,
                   bool state_redundancy = false);
  // The same over `host`'s budget, shared (MemoryBudget's second constructor).
  SessionAdmission(const MemoryBudget& host, int64_t max_session_bytes, int rank,
                   bool state_redundancy);

  // Reserves the footprint of `config`'s replica under `layout` until the reservation goes.
  // RESOURCE_EXHAUSTED, before anything is allocated: "session '<name or id>' needs N bytes on
  // rank R (masters M, optimizer state S, gradients G, overhead O, workspace W), more than the
  // rank's budget of B bytes has free" (or "...; the limit is C bytes per session").
  // INVALID_ARGUMENT as the replica's creation for invalid chains or parameters. The bytes count as
  // config.owner's (MemoryBudget::HeldBy) while the reservation holds them.
  absl::StatusOr<MemoryBudget::Reservation> Admit(const SessionConfig& config, const Layout& layout,
                                                  absl::string_view id);
  // Admit's answer without reserving (rank 0 asks before the other ranks build their replicas):
  // the bytes the session would reserve of this budget. A stand-in's (its budget shared with its
  // host) also checks that the host's part of the session fits beside its own, and counts both
  // (its owner's share holds both).
  absl::StatusOr<int64_t> Check(const SessionConfig& config, const Layout& layout,
                                absl::string_view id) const;

  const MemoryBudget& budget() const { return budget_; }
  MemoryBudget& budget() { return budget_; }

 private:
  // The footprint of this rank's replica; RESOURCE_EXHAUSTED over max_session_bytes_.
  absl::StatusOr<SessionFootprint> FootprintOf(const SessionConfig& config, const Layout& layout,
                                               absl::string_view asker) const;

  const int64_t max_session_bytes_;
  const int rank_;
  const bool state_redundancy_;
  MemoryBudget budget_;
};

// One owner's share of a rank (EngineOptions::max_sessions_per_owner, owner_memory_share), so
// that one tenant cannot take every session or the whole budget of a rank that others share.
struct OwnerLimits {
  int max_sessions = 0;       // 0: no limit of its own
  double memory_share = 1.0;  // of the rank's budget; 1: no limit of its own
};
// The part of `total` bytes (a budget, a headroom) that one owner may hold under `memory_share`:
// all of it at 1 or more.
inline int64_t OwnerShareOf(double memory_share, int64_t total) {
  return memory_share >= 1.0 ? total
                             : static_cast<int64_t>(memory_share * static_cast<double>(total));
}
// What one owner holds on a rank: its sessions and the bytes they reserved.
struct OwnerHoldings {
  int sessions = 0;
  int64_t bytes = 0;
  int segments = 0;  // memory segments shared with its sessions' trainers
};
// "owner 'NAME'", or "the anonymous owner" for an empty name.
std::string OwnerName(absl::string_view owner);
// OK when a new session of `owner` (named `asker` in the message) that reserves `bytes` on rank
// `rank`, whose budget is `budget`, fits in `limits` beside `held`; else RESOURCE_EXHAUSTED naming
// the owner, what it holds and the limit.
absl::Status CheckOwnerShare(absl::string_view owner, absl::string_view asker, int64_t bytes,
                             const OwnerHoldings& held, const OwnerLimits& limits, int64_t budget,
                             int rank);

// Reserves `bytes` of `budget` (rank `rank`'s) as `owner`'s (MemoryBudget::TryReserve, `asker`
// and `detail` naming them) once CheckOwnerShare finds them within the owner's `memory_share` of
// the budget beside what the owner holds there already: its sessions, the snapshots their streams
// hold, their trainers' shared memory and what their streams stage. Checked and reserved under
// one lock: reservations of one owner made at once pass its share no more than one at a time.
absl::StatusOr<MemoryBudget::Reservation> ReserveAsOwner(MemoryBudget& budget, int64_t bytes,
                                                         absl::string_view asker,
                                                         absl::string_view detail,
                                                         absl::string_view owner,
                                                         double memory_share, int rank);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_ADMISSION_H_
