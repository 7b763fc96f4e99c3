#ifndef OPTSTEP_SERVER_RPC_HEAL_H_
#define OPTSTEP_SERVER_RPC_HEAL_H_

// Healing a group from memory (docs/deploy.md, "Failure handling"): a rank restarted with its
// ordinal rejoins the running group, which keeps its sessions. Rank 0 coordinates every heal,
// its own too:
//
//   restarted rank r (r > 0)                 rank 0 (HealRejoinedRank)
//   sees the group formed (store key),
//   PeerService.Rejoin(r, address)  ------>  generation g + 1; every rank: Regroup kBegin
//                                            (steps refused, r's address learnt);
//                                            each session: r creates its replica (same id,
//                                            definition, owner; the group's resolutions) while
//                                            every other rank rebuilds its communicator (kRebuild);
//                                            each session's state: the rank fetches it
//                                            (kTransfer: the masters a peer holds, its own
//                                            masters and state from its buddy's shadow, its
//                                            shadow duty from its predecessor);
//                                            every rank a step behind another (a lost peer cut
//                                            its all-gather alone): that step (kCatchUp);
//                                            every rank: Regroup kEnd (steps taken again)
//   serves  <------------------------------  the generation
//
// A restarted rank 0 (HealRankZero) serves a new, empty rendezvous store: the survivors, which
// wait for it, publish their addresses there again; it asks each of them whether it survived
// (PeerService.ListReplicas), takes the sessions they all list (each described by rank 1) and
// heals itself as above, in a generation above theirs (its replicas made on itself, its state
// fetched by itself).
//
// The optimizer state a rank owns is kept on its buddy too (state redundancy, shadow_state.h):
// the heal needs it, so only a group with --state_redundancy=1 heals. Every rank ends the heal
// with Session::ResumeAfterHeal: a step interrupted by the loss is redone by its trainers.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// Store key rank 0 sets once its group formed: a rank that finds it set at start was restarted
// into a running group and rejoins it.
inline constexpr char kGroupFormedKey[] = "optstep/group/formed";

// Rank 0: heals the restarted rank `request.rank`, reachable at `request.address`, into the
// group, as above. Answers the new generation. FAILED_PRECONDITION on other ranks, when the group
// does not heal (--state_redundancy=0), when another peer is lost too, or when a session cannot be
// healed; the peers' errors name the rank. Blocks; one heal at a time.
// A stand-in for the rank (RejoinRequest.stand_in) is recorded as such on every rank
// (Regroup kBegin, RankGroup::stood_in_ranks), the rank's own process as not.
// A heal that fails because the rejoining process (`request.incarnation`) was lost meanwhile
// costs the group nothing: every rank waits on for the rank, whose next process heals in. Any
// other failure is told to RankGroupOptions::on_heal_failed (the group restarts as a whole).
absl::StatusOr<uint64_t> HealRejoinedRank(Engine* engine, RankGroup* group,
                                          const v1::RejoinRequest& request);

// Rank 0 of a group that heals, once joined (every peer's address known), before it restores or
// creates anything: asks every other rank whether it survived the loss of rank 0's earlier
// process and waits for it (PeerService.ListReplicas; a rank that does not know the call did
// not). None did: nullopt (a new group). All did: heals this rank into their group, as above (the
// generation one above the highest of theirs), and answers that generation. A session only some
// survivors hold (SessionsCutOnSurvivors) is closed on them first, and `on_session_closed` told
// (RankGroup::CloseCutSession). Some did: FAILED_PRECONDITION naming a rank
// that did not (the group restarts as a whole); a peer's error names the rank.
absl::StatusOr<std::optional<uint64_t>> HealRankZero(Engine* engine, RankGroup* group);

// Rank 0 healing itself in: the sessions some survivors of `lists` (by rank; rank 0's unused,
// each in session id order, ListReplicas) hold and others do not, in id order. A creation or a
// close that the loss of rank 0 cut reached only some of them: the creation was never answered
// (its caller tries again), the close was its owner's request; a heal from one rank's list would
// wait in the others' rendezvous until the timeout. Their resolutions may differ (a resolution
// the loss cut on some survivors only): the heal's end counts rank 0's, taken from rank 1, on
// every rank.
std::vector<std::string> SessionsCutOnSurvivors(const std::vector<v1::ListReplicasResponse>& lists);

// This rank's answer to PeerService.ListReplicas: whether it awaits rank 0's heal, its
// generation, and its sessions in id order, each by id and resolutions; or, for a request naming
// a session, that session as a healed rank recreates it.
absl::StatusOr<v1::ListReplicasResponse> ListReplicas(Engine* engine, const RankGroup& group,
                                                      const v1::ListReplicasRequest& request);
// Whom each rank takes a later step of a session from as a heal ends (Regroup kCatchUp), by
// session id: the rank to fetch it from.
using CatchUpSources = std::map<std::string, uint32_t>;
// From every rank's list (`lists`, by rank; ListReplicas, each session with its step): for each
// rank, the sessions it is a step behind in and, for each, the lowest rank that finished that
// step. A ring all-gather cut by a rank's death can complete on some ranks and fail on others,
// which then wait to redo a step their trainers may never send again (the ranks that completed
// it answer it as applied). A rank that lists no step (an earlier release) is left out.
// FAILED_PRECONDITION naming the session and the ranks when a rank is further behind.
absl::StatusOr<std::vector<CatchUpSources>> PlanCatchUp(
    const std::vector<v1::ListReplicasResponse>& lists);
// This rank's part of Regroup kCatchUp: each session of `sources` takes the masters and step
// counters of the rank named (its own block and state, already at that step, are the same
// there; the interrupted step is then no longer redone). The error names the session and the
// rank; INVALID_ARGUMENT for a rank that is not a peer.
absl::Status CatchUpFromPeers(Engine* engine, RankGroup* group, const CatchUpSources& sources);

// PeerService.CreateReplica's work on this rank (also rank 0's own replicas when it heals):
// the admission check alone, or the replica built, counting the group's resolutions. A replica
// healed in (the group's resolutions given) while this rank runs the heal into
// `heal_generation` is paused for it, as the other ranks' replicas are (Session::PauseForHeal):
// no resolution starts on it (an abort vote relayed meanwhile) before the heal ends.
absl::Status CreateReplicaHere(Engine* engine, const v1::CreateReplicaRequest& request,
                               std::optional<uint64_t> heal_generation = std::nullopt);

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
// Every rank once the heal into `generation` ended well (Regroup kEnd): each session takes steps
// again, an interrupted step redone.
void ResumeSessions(Engine* engine, uint64_t generation);

// Regroup phase `phase` of generation `generation`, healing rank `rank` at `address`.
v1::RegroupRequest Phase(uint64_t generation, int rank, const std::string& address,
                         v1::RegroupRequest::Phase phase);

// Rank r > 0, restarted (or a stand-in for it, RankGroupOptions::stand_in): asks rank 0
// (`group`'s peer 0) to heal it into the group, waiting as long as the heal takes while rank 0
// answers its pings (given up once it has not for twice the peer timeout). Answers the
// generation joined.
absl::StatusOr<uint64_t> RequestRejoin(RankGroup* group, const std::string& address);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEAL_H_
