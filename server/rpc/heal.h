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
//                                            each session's state: the rank fetches it
//                                            (kTransfer: every master from a peer, its own
//                                            from its buddy's shadow, its shadow duty from its
//                                            predecessor);
//                                            every rank: Regroup kEnd (steps taken again)
//   serves  <------------------------------  the generation
//
// The optimizer state a rank owns is kept on its buddy too (state redundancy, shadow_state.h):
// the heal needs it, so only a group with --state_redundancy=1 heals. Every rank ends the heal
// with Session::ResumeAfterHeal: a step interrupted by the loss is redone by its trainers.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
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

// What a healed rank fetches of a session from a peer (PeerService.FetchOwnedState,
// FetchShadow, FetchMasters): a state dict.
enum class HealPart { kOwned, kShadow, kMasters };
using HealFetch = std::function<absl::StatusOr<std::shared_ptr<const StateDict>>(
    int peer, const std::string& session_id, HealPart part)>;

// The rejoining rank r of N, with state redundancy (Regroup kTransfer): for each session, every
// master from a peer, its own state from its buddy's shadow (rank (r + 1) % N), and its shadow of
// its predecessor (rank (r - 1) % N) from that rank's own state, each imported into its replica.
// The first error names the session and the peer.
absl::Status TakeStateFromPeers(Engine* engine, int rank, int world_size, const HealFetch& fetch);
// Rank r of N: its shadow of `session`'s predecessor (rank (r - 1) % N) fetched again from that
// rank's own state and imported (after a state import replaced it there, or in a heal). The
// error names the session and the peer. REQUIRES: between steps (a held session).
absl::Status RefreshShadow(Session& session, int rank, int world_size, const HealFetch& fetch);
// The HealFetch of `group`'s peers: PeerService.FetchOwnedState / FetchShadow / FetchMasters,
// learning the peer's address from the store when this rank does not know it yet. The state
// whole and checked (every element once); the peer's error prefixed with its rank.
HealFetch PeerFetch(RankGroup* group);
// Every rank once a heal ended well (Regroup kEnd): each session takes steps again, an
// interrupted step redone.
void ResumeSessions(Engine* engine);

// Rank r > 0, restarted: asks rank 0 (`group`'s peer 0) to heal it into the group, waiting up to
// `timeout`. Answers the generation joined.
absl::StatusOr<uint64_t> RequestRejoin(RankGroup* group, const std::string& address,
                                       absl::Duration timeout);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEAL_H_
