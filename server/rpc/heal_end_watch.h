#ifndef OPTSTEP_SERVER_RPC_HEAL_END_WATCH_H_
#define OPTSTEP_SERVER_RPC_HEAL_END_WATCH_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"

namespace optstep {

// Whether a rank missed the end of a heal, judged from rank 0's heartbeat answers.
//
// Rank 0 coordinates every heal of its group and ends it on every other rank before itself
// (PeerService.Regroup kEnd, made again while the rank answers pings, for at most the group's
// timeout). A rank that missed that call for good stays paused in the heal and answers
// NOT_SERVING while it lives, and nothing restarts it: its own bounds wait for heals to end. Rank
// 0's answers say which generation it is at and whether it heals into it. Once they have said,
// for longer than `bound`, that rank 0 ended the heal this rank still runs (or began a later
// one), this rank missed the end. The time is passed in, never read here.
// Thread-compatible (RankGroup guards it).
class HealEndWatch {
 public:
  explicit HealEndWatch(absl::Duration bound) : bound_(bound) {}

  // This rank began a heal into `generation`; it ended the heal it ran.
  void Began(uint64_t generation);
  void Ended();
  // An answer of rank 0, had at `now`: its generation, and whether it heals into it.
  void HeardRankZero(uint64_t generation, bool healing, absl::Time now);
  // The generation of the heal this rank still runs although rank 0's answers have said since
  // longer than `bound` before `now` that it ended; nullopt otherwise.
  std::optional<uint64_t> Missed(absl::Time now) const;

 private:
  const absl::Duration bound_;
  std::optional<uint64_t> running_;  // the heal this rank runs, by generation
  // Since the first of the answers in a row that said rank 0 no longer runs `running_`.
  std::optional<absl::Time> ended_since_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEAL_END_WATCH_H_
