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

absl::StatusOr<MemoryBudget::Reservation> SessionAdmission::Admit(const SessionConfig& config,
                                                                  const Layout& layout,
                                                                  absl::string_view id) {
  OPTSTEP_ASSIGN_OR_RETURN(const SessionFootprint footprint,
                           ComputeFootprint(config, layout, rank_, state_redundancy_));
  const std::string asker = absl::StrCat("session '", config.name.empty() ? id : config.name, "'");
  if (max_session_bytes_ > 0 && footprint.total() > max_session_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        asker, " needs ", footprint.total(), " bytes on rank ", rank_, " (", footprint.Breakdown(),
        "); the limit is ", max_session_bytes_, " bytes per session"));
  }
  return budget_.TryReserve(footprint.total(), asker, footprint.Breakdown());
}

absl::Status SessionAdmission::Check(const SessionConfig& config, const Layout& layout,
                                     absl::string_view id) {
  return Admit(config, layout, id).status();  // the reservation goes at once
}

}  // namespace optstep
