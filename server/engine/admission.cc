#include "server/engine/admission.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {

SessionAdmission::SessionAdmission(int64_t budget_bytes, int64_t max_session_bytes, int rank,
                                   bool state_redundancy)
    : max_session_bytes_(max_session_bytes),
      rank_(rank),
      state_redundancy_(state_redundancy),
      budget_(budget_bytes, rank) {}

SessionAdmission::SessionAdmission(const MemoryBudget& host, int64_t max_session_bytes, int rank,
                                   bool state_redundancy)
    : max_session_bytes_(max_session_bytes),
      rank_(rank),
      state_redundancy_(state_redundancy),
      budget_(host, rank) {}

absl::StatusOr<SessionFootprint> SessionAdmission::FootprintOf(const SessionConfig& config,
                                                               const Layout& layout,
                                                               absl::string_view asker) const {
  OPTSTEP_ASSIGN_OR_RETURN(SessionFootprint footprint,
                           ComputeFootprint(config, layout, rank_, state_redundancy_));
  if (max_session_bytes_ > 0 && footprint.total() > max_session_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        asker, " needs ", footprint.total(), " bytes on rank ", rank_, " (", footprint.Breakdown(),
        "); the limit is ", max_session_bytes_, " bytes per session"));
  }
  return footprint;
}

absl::StatusOr<MemoryBudget::Reservation> SessionAdmission::Admit(const SessionConfig& config,
                                                                  const Layout& layout,
                                                                  absl::string_view id) {
  const std::string asker = absl::StrCat("session '", config.name.empty() ? id : config.name, "'");
  OPTSTEP_ASSIGN_OR_RETURN(const SessionFootprint footprint, FootprintOf(config, layout, asker));
  return budget_.TryReserve(footprint.total(), asker, footprint.Breakdown(), config.owner);
}

absl::StatusOr<int64_t> SessionAdmission::Check(const SessionConfig& config, const Layout& layout,
                                                absl::string_view id) const {
  const std::string asker = absl::StrCat("session '", config.name.empty() ? id : config.name, "'");
  OPTSTEP_ASSIGN_OR_RETURN(const SessionFootprint footprint, FootprintOf(config, layout, asker));
  OPTSTEP_RETURN_IF_ERROR(budget_.CheckFits(footprint.total(), asker, footprint.Breakdown()));
  // A stand-in shares its host's budget, and the host checks its own part at the same time:
  // each part alone could fit where both do not, and the replica refused as it is built would
  // leave the other ranks waiting for it in the rendezvous. The stand-in checks both parts
  // (nothing is reserved, so checks made at once do not count each other).
  const int host = budget_.host_rank();
  if (host >= 0) {
    OPTSTEP_ASSIGN_OR_RETURN(const SessionFootprint hosts,
                             ComputeFootprint(config, layout, host, state_redundancy_));
    OPTSTEP_RETURN_IF_ERROR(
        budget_.CheckFits(footprint.total() + hosts.total(), asker,
                          absl::StrCat(footprint.Breakdown(), "; and rank ", host,
                                       "'s part beside it, ", hosts.total(), " bytes")));
    return footprint.total() + hosts.total();
  }
  return footprint.total();
}

std::string OwnerName(absl::string_view owner) {
  return owner.empty() ? "the anonymous owner" : absl::StrCat("owner '", owner, "'");
}

absl::Status CheckOwnerShare(absl::string_view owner, absl::string_view asker, int64_t bytes,
                             const OwnerHoldings& held, const OwnerLimits& limits, int64_t budget,
                             int rank) {
  const std::string who = OwnerName(owner);
  if (limits.max_sessions > 0 && held.sessions >= limits.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, " holds ", held.sessions, " sessions on rank ", rank, "; the limit per owner is ",
        limits.max_sessions, " (--max_sessions_per_owner)"));
  }
  if (limits.memory_share >= 1.0) return absl::OkStatus();
  const int64_t share = OwnerShareOf(limits.memory_share, budget);
  if (held.bytes + bytes <= share) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      asker, " needs ", bytes, " bytes on rank ", rank, "; the sessions of ", who, " hold ",
      held.bytes, " of the ", share, " bytes one owner may take (--owner_memory_share ",
      limits.memory_share, " of the rank's budget of ", budget, ")"));
}

absl::StatusOr<MemoryBudget::Reservation> ReserveAsOwner(MemoryBudget& budget, int64_t bytes,
                                                         absl::string_view asker,
                                                         absl::string_view detail,
                                                         absl::string_view owner,
                                                         double memory_share, int rank) {
  return budget.TryReserve(bytes, asker, detail, owner, [&](int64_t owner_holds) {
    return CheckOwnerShare(owner, asker, bytes, OwnerHoldings{0, owner_holds},
                           OwnerLimits{0, memory_share}, budget.budget(), rank);
  });
}

}  // namespace optstep
