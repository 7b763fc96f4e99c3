#ifndef OPTSTEP_SERVER_RPC_RANK_GROUP_H_
#define OPTSTEP_SERVER_RPC_RANK_GROUP_H_

// The ranks of a group as seen from one of them (RankGroup): their addresses and stubs, the
// session lifecycle across them (rank 0 creates every session everywhere), the heals of lost
// ranks (generations, Regroup) and the abort relay, configured by RankGroupOptions.

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/serial_executor.h"
#include "kernels/comm/key_value_store.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "optstep/v1/session.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/group_communicators.h"
#include "server/rpc/heal_end_watch.h"
#include "server/rpc/peer_heartbeat.h"
#include "server/rpc/peer_liveness.h"
#include "server/rpc/state_dict_stream.h"

namespace optstep {

struct RankGroupOptions {
  int rank = 0;
  int world_size = 1;
  // Rendezvous and replica creation give up after this, and a peer's stream of state that
  // pauses this long is cancelled (RankGroup::ReadState).
  absl::Duration timeout = absl::Seconds(120);
  // Checkpoint directories of Save / Load (a shared file system); empty: Save and Load answer
  // FAILED_PRECONDITION. keep_checkpoints: how many complete checkpoints Save keeps (0: all).
  std::string checkpoint_root;
  int keep_checkpoints = 0;
  // Rank 0 removes the temporaries of saves idle this long before each Save (a crash's, which
  // the sweep at start-up left while they were younger); zero: never.
  absl::Duration checkpoint_temp_max_age = absl::ZeroDuration();
  // A hold (docs/checkpoints.md) ends by itself this long after its last call or progress.
  absl::Duration hold_lease = absl::Seconds(30);
  // How long ranks may take to reach the resolution a hold settles at (a step may still wait for
  // its trainers or its deadline).
  absl::Duration settle_timeout = absl::Seconds(120);
  // How this rank calls the others (TLS, token); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
  // Heartbeats (StartHeartbeats): every `heartbeat_interval` this rank pings the others; one that
  // has not answered for `peer_timeout` is lost, and the group with it.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration peer_timeout = absl::Seconds(5);
  // Told of each peer found lost (metrics, exit on peer loss); may be null. Called on the
  // heartbeat thread.
  std::function<void(int rank)> on_peer_lost;
  // Rank 0: told of each session its owner closes (CloseSession), before any rank drops it; may
  // be null.
  std::function<void(const std::string& session_id)> on_session_closed;
  // Rank 0 with automatic checkpoints: a held operation that replaces a session's state (a Load,
  // a state dict import) calls this once every rank staged the state, before any applies it,
  // with the step from which the session's automatic checkpoints belong to the timeline it
  // leaves (AutoCheckpointer::Replacing), and, for a Load of the session's own automatic
  // checkpoint, that checkpoint's step (`kept_step`: it holds the new timeline's state too; then
  // `from_step` is one above it). The answer is told once whether the ranks were asked to apply.
  // An error fails the operation, nothing applied. May be null.
  using ReplacementDone = std::function<void(bool applied)>;
  std::function<absl::StatusOr<ReplacementDone>(const std::string& session_id, uint64_t from_step,
                                                std::optional<uint64_t> kept_step)>
      replacing_state;
  // The sessions' communicators, rebuilt when a restarted rank rejoins (Regroup); null: the
  // group cannot heal (a lost rank means a restart of the group).
  GroupCommunicators* communicators = nullptr;
  // A restarted rank may rejoin the running group (heal.h): --state_redundancy=1.
  bool heal = false;
  // Told when a restarted rank could not be healed into the group (the group restarts instead):
  // on rank 0, any rank but one whose process was lost during the heal (heal.h); on the others,
  // rank 0 itself (Regroup kEnd, failed). May be null.
  std::function<void(const absl::Status& why)> on_heal_failed;
  // Points this rank's rendezvous store (the one its communicators rebuild in) at `target`, the
  // store of the rank 0 coordinating a heal (Regroup kBegin); empty: the configured one
  // (--rendezvous). May be null (the store never moves).
  std::function<void(const std::string& target)> retarget_store;
  // This rank is a stand-in for a lost rank, run in its buddy's process (docs/deploy.md, "A rank
  // that does not return"): it says so when it rejoins and when rank 0 asks who survived.
  bool stand_in = false;
  // Testing only (--kill_during_heal): told each time this rank fetched a state dict from a peer
  // (PeerFetch: its heal's transfer, a catch-up, a shadow refresh). May be null.
  std::function<void()> on_heal_fetched;
  // Testing only (--delay_rejoin_ms): called on rank 0 before it heals in a rank that asked to
  // rejoin (HealRejoinedRank). May be null.
  std::function<void()> on_rejoin;
  // Testing only (--drop_first_peer_call): asked before each attempt of a call that is made
  // until rank `r` takes it (CallUntilTaken; `call` names it: "HealEnd", "CloseReplica",
  // "RefreshShadow", or "FetchOwnedState" for rank 0's own refresh from rank `r`;
  // `attempt` counts from 0 in each such call); true drops the attempt, as if it were lost on the
  // way. May be null.
  std::function<bool(absl::string_view call, int r, int attempt)> drop_peer_call;
  // Testing only (--hang_in_save_shard): called as this rank begins writing its shard for a
  // peer's PeerService.SaveShard. May be null.
  std::function<void()> on_save_shard;
};

// The ranks of a group as seen from one of them: their addresses and the stubs that call them,
// the session lifecycle across them, and the abort relay. Rank 0 allots session ids and creates
// each session on every rank (its peers through PeerService.CreateReplica, itself through its
// engine), so that every rank holds a replica with the same id and joins the same communicator
// group. Operations that hold a session on every rank are HeldOperations (held_operations.h); a
// rank's side of all of these is PeerServiceImpl (peer_service.h). The heartbeats between the
// ranks (PeerHeartbeat) tell whether every peer is still there (PeersStatus).
// Thread-safe. Calls block (rendezvous, connecting); never call them on a gRPC reaction, except
// RelayAbortVote, which returns at once.
class RankGroup {
 public:
  // With several ranks, relays the abort votes of this rank's sessions (RelayAbortVote).
  RankGroup(RankGroupOptions options, Engine* engine);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const RankGroupOptions& options() const { return options_; }

  // Publishes this rank's address ("host:port" the other ranks and trainers reach it at) in the
  // store; rank 0 also waits for every other rank's.
  // `store` is the group's rendezvous store (rank 0's RendezvousService); unused for world size 1.
  absl::Status Join(const std::string& advertise_address, std::shared_ptr<KeyValueStore> store);
  // The address of every rank, by rank (after Join on rank 0).
  std::vector<std::string> addresses() const;

  // Starts the heartbeats to the other ranks (once joined); nothing with one rank, or after Leave.
  void StartHeartbeats();
  // This rank shuts down on purpose: its heartbeats stop (it judges no peer any more), and the
  // peers it watched are told, so that they count it as gone rather than lost (they stop serving:
  // the group is no longer whole). Without `announce` (a stand-in whose rank's own process took
  // its place) the peers are not told. Idempotent.
  void Leave(bool announce = true);
  // Peer `rank` said it shuts down on purpose (PeerService.Ping with `leaving`).
  void PeerLeft(int rank);
  // OK while every peer is there and no rank is rejoining; else UNAVAILABLE naming the first
  // rank lost or gone (and what to do), or the rank rejoining. Calls that need the whole group
  // answer it.
  absl::Status PeersStatus() const;
  // OK unless a peer is lost or a rank is rejoining (a peer that left still completes the step it
  // runs); else UNAVAILABLE naming the rank. Calls that cannot end without every rank answer it.
  absl::Status LostPeersStatus() const;
  // PeersStatus without the heal: the held operations of the heal itself run under it.
  absl::Status MembersStatus() const { return liveness_.status(); }
  // How many peers other than `except` are lost or gone now; whether peer `rank` is.
  int lost_peers(int except = -1) const { return liveness_.lost_count(except); }
  bool peer_failed(int rank) const { return liveness_.failed(rank); }
  // The group formed: on rank 0, once it restored or healed its sessions (it takes creations from
  // then on); on another rank, once a heartbeat answer of rank 0 said so, or it rejoined the
  // group. Before that a lost rank 0 restarts the group: its next process would find
  // only some of the sessions that its automatic checkpoints hold.
  void MarkFormed();
  bool formed() const;
  // Rank 0: peer `rank` told it knows that the group formed (PeerService.Ping).
  void NoteFormedSeen(int rank);
  // Rank 0: waits up to `bound` until every peer told it knows that the group formed; answers
  // whether they did. Until a peer knows, losing rank 0 restarts the group rather than heal it.
  bool AwaitFormedSeen(absl::Duration bound);
  // A rank other than 0 of a formed group that heals, whose rank 0 is lost or gone: it waits for
  // rank 0's next process, which heals itself into this rank's group (heal.h, HealRankZero).
  bool AwaitsRankZero() const {
    return options_.rank != 0 && options_.heal && formed() && liveness_.failed(0);
  }
  // This process among the rank's restarts (its start time in nanoseconds since the epoch): the
  // heartbeats' answers carry it, so that a peer restarted within the peer timeout is noticed.
  uint64_t incarnation() const { return incarnation_; }

  // ---- Healing (heal.h) ----

  // The group's generation: 0 as first formed, one more at each rank healed into it.
  uint64_t generation() const;
  // This rank's part of a heal, in the order rank 0 calls them (PeerService.Regroup): kBegin
  // stops new steps, learns the rejoining rank's address and watches it as alive again, and
  // pauses every session's resolutions (Session::PauseForHeal);
  // kRebuild reconnects every session's communicator in the new generation (blocks until every
  // rank does); kEnd takes steps again (after a failed heal the heartbeats judge the rank, and the
  // sessions' pause is cancelled; a failed heal of rank 0 itself is told to `on_heal_failed`).
  // kEnd of a heal that is not the one running here (another generation, or the same generation
  // of another process: a refused heal, one this process never began) is FAILED_PRECONDITION and
  // changes nothing.
  absl::Status Regroup(const v1::RegroupRequest& request);
  // kBegin in its two parts, which rank 0 runs apart when it coordinates: the heal begins here
  // (the generation, the rank's address, the store), then the sessions pause and the old
  // connections close. Rank 0 pauses beside the other ranks, not before them: a step it runs can
  // wait in a collective on a peer that ends its own only once it closed its connections.
  absl::Status BeginRegroup(const v1::RegroupRequest& request);
  absl::Status PauseForRegroup(const v1::RegroupRequest& request);
  // Whether a heal runs here (between kBegin and kEnd).
  bool healing() const;
  // Told of each heartbeat answer of rank 0 (PingResponse.generation, .healing).
  void HearOfRankZeroHeal(uint64_t generation, bool healing);
  // The generation of the heal this rank still runs although rank 0 ended it, as its answers
  // have said for longer than the peer timeout (HealEndWatch): this rank missed the heal's end
  // for good. nullopt otherwise.
  std::optional<uint64_t> MissedHealEnd() const;
  // OK while a heal into generation `generation` runs here (between kBegin and kEnd): the phases
  // that move state (kTransfer, kCatchUp) run only then; else FAILED_PRECONDITION saying why.
  absl::Status CheckHealing(uint64_t generation) const;
  // Whether rank `rank`'s process `incarnation` is gone: a ping (within the peer timeout) is not
  // answered, or another process answers it (its supervisor restarted it already).
  bool ProcessGone(int rank, uint64_t incarnation);
  // Whether rank `rank` answers a ping within the peer timeout.
  bool Answers(int rank);
  // The same on `context` (fresh; another thread may cancel it).
  bool Answers(int rank, grpc::ClientContext* context);
  // Makes `attempt`, a call to rank `rank` that must not be missed (`call` names it in the log),
  // again while it fails for a passing reason (UNAVAILABLE, DEADLINE_EXCEEDED: a reset, a call
  // lost on the way), 100 ms and then up to 2 s later, while the rank answers its pings and for
  // at most the group's timeout. Answers the last attempt's status.
  absl::Status CallUntilTaken(int rank, absl::string_view call,
                              const std::function<absl::Status()>& attempt);
  // PeerService.CloseReplica of session `id` on rank `rank`, made until taken (CallUntilTaken).
  absl::Status CloseReplicaOn(int rank, const std::string& id);
  // Heals of one rank in a row that may fail for a passing reason, or because its process was
  // lost meanwhile, before the group restarts as a whole instead (the rank's supervisor tries
  // again each time).
  static constexpr int kMaxHealsLostInARow = 3;
  // Rank 0 (a survivor, for rank 0's own heals): counts the heals of rank `rank` in a row whose
  // process was lost while it healed in, or that failed for a passing reason, and answers how
  // many (a heal that succeeds begins the count again).
  int CountHealLost(int rank);
  void CountHealed(int rank);
  // PeerService.CreateReplica on `rank` (a peer): builds its replica (its session id, definition,
  // owner, request id, and the resolutions the other ranks finished: a rank rejoining the group
  // too), or with `request.admission_only` only answers whether it would admit it. The error
  // names the rank.
  absl::Status CreateReplicaOn(int rank, const v1::CreateReplicaRequest& request);
  // Whether rank `rank`, as healed in last, is a stand-in (RejoinRequest.stand_in; every rank
  // learns it at Regroup kBegin, a restarted rank 0 from the survivors' lists); and the ranks that
  // are, in rank order (SessionInfo.layout.stood_in_ranks).
  void SetStoodIn(int rank, bool stood_in);
  std::vector<uint32_t> stood_in_ranks() const;
  // Where a stand-in for a lost rank 0 runs, as this rank knows it (empty: none): rank 1 sets it
  // when it starts or stops one in its process, the others learn it from rank 1's heartbeat
  // answers. The ranks publish their addresses into the stand-in's store, as for a restarted
  // rank 0 (RankProcess::PublishForRankZero).
  void SetRankZeroStandIn(const std::string& address);
  std::string rank_zero_stand_in() const;
  // Where a peer's heartbeat said the group keeps its rendezvous store while rank 0 is stood in
  // (PingRequest.rendezvous; empty: told of none). A restarted rank whose configured store does
  // not answer looks for its group there (RankProcess::FindsRunningGroup).
  void HearOfRendezvous(const std::string& address);
  std::string heard_rendezvous() const;
  // Serialises the heals on rank 0 (one restarted rank at a time).
  absl::Mutex& heal_mu() { return heal_mu_; }
  // Serialises the sessions' lifecycle on rank 0 with its heals, which take it before heal_mu():
  // a session created, restored or closed while a heal rebuilt and moved the sessions made the
  // heal fail (a session missing on the healed rank, or on the survivors), and the group restart.
  absl::Mutex& lifecycle_mu() ABSL_LOCK_RETURNED(create_mu_) { return create_mu_; }

  // Rank 0: creates (or attaches by name to) a session on every rank. FAILED_PRECONDITION on
  // other ranks, UNAVAILABLE in a group that heals before it formed (a restarted rank 0 has yet
  // to heal itself in or restore the sessions) and once a peer is lost (PeersStatus). On failure
  // the replicas already made are closed again. The session belongs to `owner`, who attaches by
  // name only to a session of its own. A non-empty `request_id` (CreateSessionRequest's: at most
  // kMaxRequestIdBytes, else INVALID_ARGUMENT; convert.h) is kept with the session on every
  // rank, and a call of the same owner and request_id answers that session
  // (Engine::FindExisting).
  absl::StatusOr<Engine::Created> CreateSession(const v1::SessionSpec& spec,
                                                const std::string& owner,
                                                const std::string& request_id);
  // Rank 0: recreates a session with id `id` on every rank (automatic restore: the group
  // restarted), belonging to `owner` and made by `request_id` (may be empty). As CreateSession,
  // but never attaches.
  absl::StatusOr<std::shared_ptr<Session>> RestoreSession(const std::string& id,
                                                          const v1::SessionSpec& spec,
                                                          const std::string& owner,
                                                          const std::string& request_id);
  // Rank 0 of a group that heals before it formed (it restores its sessions, or heals itself in):
  // UNAVAILABLE naming `what` (it holds none or some of the group's sessions yet); else OK.
  absl::Status FormingStatus(absl::string_view what) const;
  // Rank 0: tells `on_session_closed` of a session the group serves, then closes it on every rank
  // (the peers' errors are logged, not returned). Waits for a heal that runs (lifecycle_mu).
  // FAILED_PRECONDITION on another rank: its copy alone would go.
  absl::Status CloseSession(const std::string& id) ABSL_LOCKS_EXCLUDED(create_mu_);
  // Closes the session on every rank without telling `on_session_closed` (a creation or a
  // restore that failed).
  absl::Status DropSession(const std::string& id);
  // Rank 0 healing itself in (HealRankZero): closes a session that a creation or a close cut by
  // the loss of rank 0 left on some ranks only on those that hold it, then tells
  // `on_session_closed` (its automatic checkpoints go, as its close would have removed them, or
  // as its creation never answered should leave none). A rank's error but NOT_FOUND is answered.
  absl::Status CloseCutSession(const std::string& id);

  // A session voted to abort `step` as its resolution `resolution` (on this rank, or on the
  // rank that called this one's PeerService.AbortStep): tells rank 0, which tells every other
  // rank, so that all of them meet the vote. Returns at once; the calls run on their own thread.
  void RelayAbortVote(const std::string& session_id, uint64_t resolution, uint64_t step);

  // ---- Calling the other ranks (HeldOperations and the abort relay) ----

  // Learns rank r's address from the store unless known (ranks other than 0 know only theirs),
  // waiting at most `wait` for it.
  absl::Status EnsureAddress(int rank, absl::Duration wait = absl::Seconds(5));
  // The stub that calls rank `rank` (made on first use, kept for the group's life).
  v1::PeerService::Stub* Peer(int rank);
  // Runs `call(r)` for every rank at once (rank 0's on this thread, the others on threads of
  // their own); the lowest rank's error.
  absl::Status ForEachRank(const std::function<absl::Status(int rank)>& call);
  // A call to rank `rank` made by `call` on the context given, for as long as the rank answers its
  // pings: once it has not answered for twice the peer timeout, the call is cancelled and its
  // error (DEADLINE_EXCEEDED) says so, naming `what`, what the call was waiting for. A rank that
  // hangs, or whose host was lost, keeps its connection up: without this a call would hold its
  // caller to the end of its deadline, which for one that moves state must be long enough for the
  // largest state (a day for a checkpoint's shard). The peer's errors prefixed with its rank.
  absl::Status CallWhileAnswering(int rank, absl::string_view what,
                                  const std::function<grpc::Status(grpc::ClientContext*)>& call);
  // One unary PeerService call with the held-session messages, within `timeout`; one whose timeout
  // is longer than twice the peer timeout goes through CallWhileAnswering (`what` names what it
  // waits for), so that a peer that stops answering fails it sooner.
  using HeldMethod = grpc::Status (v1::PeerService::Stub::*)(grpc::ClientContext*,
                                                             const v1::HeldSessionRequest&,
                                                             v1::HeldSessionResponse*);
  absl::StatusOr<v1::HeldSessionResponse> CallPeer(int rank, HeldMethod method,
                                                   const v1::HeldSessionRequest& request,
                                                   absl::string_view what, absl::Duration timeout);
  // Reads a stream of state dict chunks from rank `rank` into `assembler`; `start` begins the
  // call (PeerService.FetchOwnedState, ExportHeldState, ...) on the stub and context given. Once
  // no chunk came for the group's `timeout`, the call is cancelled (a peer that hangs, StallWatch)
  // and the error says so, naming `what` ("fetching ..."). The peer's errors prefixed with its
  // rank. REQUIRES: the rank's address known (EnsureAddress).
  using StateStreamStart = std::function<std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>>(
      v1::PeerService::Stub& stub, grpc::ClientContext* context)>;
  absl::Status ReadState(int rank, absl::string_view what, const StateStreamStart& start,
                         StateDictAssembler& assembler);

 private:
  // REQUIRES: several ranks. Creates the replica `id` on every rank at once; closes those made
  // when one fails. A `restored` session (from its checkpoints) is admitted without its owner's
  // share (Engine::CheckAdmission).
  absl::StatusOr<std::shared_ptr<Session>> CreateEverywhere(const std::string& id,
                                                            const v1::SessionSpec& spec,
                                                            SessionConfig config, bool restored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);
  // This rank's sessions (none without an engine).
  std::vector<std::shared_ptr<Session>> Sessions() const;
  // PeerService.Ping of rank `rank`, within the peer timeout, on `context` (null: one of its own).
  grpc::Status PingOnce(int rank, v1::PingResponse* response,
                        grpc::ClientContext* context = nullptr);

  const RankGroupOptions options_;
  Engine* const engine_;
  const uint64_t incarnation_;

  // Serialises session creation on rank 0, so that two trainers creating the same named
  // session at once attach to one session with one id on every rank; and the lifecycle with the
  // heals (lifecycle_mu).
  absl::Mutex create_mu_;

  mutable absl::Mutex mu_;
  std::shared_ptr<KeyValueStore> store_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<v1::PeerService::Stub>> peers_ ABSL_GUARDED_BY(mu_);
  // Stubs of a rank's earlier address, kept: a caller may still hold one (Peer answers pointers).
  std::vector<std::unique_ptr<v1::PeerService::Stub>> retired_peers_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // UNAVAILABLE while a rank rejoins (between Regroup's kBegin and kEnd), and the address of the
  // process rejoining: only the kEnd of that heal ends it.
  absl::Status healing_ ABSL_GUARDED_BY(mu_);
  std::string healing_address_ ABSL_GUARDED_BY(mu_);
  HealEndWatch heal_end_watch_ ABSL_GUARDED_BY(mu_);
  std::string rank_zero_stand_in_ ABSL_GUARDED_BY(mu_);
  std::string heard_rendezvous_ ABSL_GUARDED_BY(mu_);
  bool formed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> formed_seen_ ABSL_GUARDED_BY(mu_);    // rank 0: NoteFormedSeen
  std::vector<bool> stood_in_ ABSL_GUARDED_BY(mu_);   // by rank
  std::vector<int> lost_heals_ ABSL_GUARDED_BY(mu_);  // by rank (CountHealLost)
  absl::Mutex heal_mu_;
  PeerLiveness liveness_;
  absl::Mutex heartbeat_mu_;
  bool left_ ABSL_GUARDED_BY(heartbeat_mu_) = false;
  // Uses the stubs: declared after them, so destroyed before them.
  std::unique_ptr<PeerHeartbeat> heartbeat_ ABSL_GUARDED_BY(heartbeat_mu_);
  // Runs RelayAbortVote's calls in order (declared last: joined first).
  std::unique_ptr<SerialExecutor> relay_;
};

// A peer's answer as an absl::Status: its code, and its message prefixed with "rank <rank>: ".
absl::Status PeerStatus(int rank, const grpc::Status& status);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_RANK_GROUP_H_
