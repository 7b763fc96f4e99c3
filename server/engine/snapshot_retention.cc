#include "server/engine/snapshot_retention.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace optstep {

void SnapshotRetention::Track(const std::shared_ptr<const ParamSnapshot>& snapshot) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(std::remove_if(tracked_.begin(), tracked_.end(),
                                [](const Tracked& t) { return t.snapshot.expired(); }),
                 tracked_.end());
  tracked_.push_back(Tracked{snapshot, snapshot->dtype, snapshot->partial});
  if (reserve_ == nullptr) return;
  // Of its kind, newest first: those past the headroom are charged (once).
  int newer = 0;
  for (auto it = tracked_.rbegin(); it != tracked_.rend(); ++it) {
    if (it->dtype != snapshot->dtype || it->partial != snapshot->partial) continue;
    if (++newer <= kInHeadroom || it->settled) continue;
    std::shared_ptr<const ParamSnapshot> held = it->snapshot.lock();
    if (held == nullptr) continue;
    it->settled = true;
    int64_t bytes = 0;
    for (const std::string& value : held->values) bytes += static_cast<int64_t>(value.size());
    absl::StatusOr<MemoryBudget::Reservation> charge = reserve_(bytes);
    if (charge.ok()) {
      held->hold->Charge(*std::move(charge));
      continue;
    }
    held->hold->Revoke(absl::ResourceExhaustedError(absl::StrCat(
        "session '", session_id_, "': the parameters of step ", held->step,
        " were let go before this stream took them all: the session stepped on to step ",
        snapshot->step, ", and holding them longer does not fit (", charge.status().message(),
        "); take a stream's parameters as they come, or pull again")));
  }
}

int SnapshotRetention::held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(tracked_.begin(), tracked_.end(),
                                        [](const Tracked& t) { return !t.snapshot.expired(); }));
}

}  // namespace optstep
