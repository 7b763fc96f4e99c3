#include "server/rpc/heal_end_watch.h"

namespace optstep {

void HealEndWatch::Began(uint64_t generation) {
  running_ = generation;
  ended_since_.reset();
}

void HealEndWatch::Ended() {
  running_.reset();
  ended_since_.reset();
}

void HealEndWatch::HeardRankZero(uint64_t generation, bool healing, absl::Time now) {
  // A rank 0 behind this rank's heal is a process that has yet to heal itself in (it starts at
  // generation 0), not the coordinator of the heal.
  const bool ended =
      running_.has_value() && (generation > *running_ || (generation == *running_ && !healing));
  if (!ended) {
    ended_since_.reset();
  } else if (!ended_since_.has_value()) {
    ended_since_ = now;
  }
}

std::optional<uint64_t> HealEndWatch::Missed(absl::Time now) const {
  if (!ended_since_.has_value() || now - *ended_since_ <= bound_) return std::nullopt;
  return running_;
}

}  // namespace optstep
