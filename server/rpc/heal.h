#ifndef OPTSTEP_SERVER_RPC_HEAL_H_
#define OPTSTEP_SERVER_RPC_HEAL_H_

// Healing a group from memory (docs/deploy.md, "Failure handling"): a rank restarted with its
// ordinal rejoins the running group, which keeps its sessions.
//
//   restarted rank r (r > 0)                 rank 0 (HealRejoinedRank)
//   sees the group formed (store key),
//   PeerService.Rejoin(r, address)  ------>  generation g + 1; every rank: Regroup kBegin
//                                            (steps refused, r's address learnt);
//                                            each session: r creates its replica (same id,
//                                            definition, owner; the group's resolutions) while
//                                            every other rank rebuilds its communicator (kRebuild);
//                                            each session: the masters and counters of rank 0
//                                            (held at one step) are imported on every rank;
//                                            every rank: Regroup kEnd (steps taken again)
//   serves  <------------------------------  the generation
//
// The optimizer state a rank owns lives only on that rank: a session in which rank r owned
// optimizer state that a step changed is healed only from a redundant copy of it; without one
// the heal fails (FAILED_PRECONDITION naming the session) and the group takes the restart path
// (exit 75, automatic checkpoints).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// Store key rank 0 sets once its group formed: a rank that finds it set at start was restarted
// into a running group and rejoins it.
inline constexpr char kGroupFormedKey[] = "optstep/group/formed";

// Rank 0: heals restarted rank `rank`, reachable at `address`, into the group, as above.
// Answers the new generation. FAILED_PRECONDITION on other ranks, when the group does not heal
// (--state_redundancy=0), when another peer is lost too, or when a session cannot be healed;
// the peers' errors name the rank. Blocks; one heal at a time.
absl::StatusOr<uint64_t> HealRejoinedRank(Engine* engine, RankGroup* group, int rank,
                                          const std::string& address);

// Rank r > 0, restarted: asks rank 0 (`group`'s peer 0) to heal it into the group, waiting up to
// `timeout`. Answers the generation joined.
absl::StatusOr<uint64_t> RequestRejoin(RankGroup* group, const std::string& address,
                                       absl::Duration timeout);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEAL_H_
