#ifndef OPTSTEP_SERVER_RANK_PROCESS_H_
#define OPTSTEP_SERVER_RANK_PROCESS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kernels/comm/communicator.h"
#include "server/engine/engine.h"
#include "server/rpc/auto_checkpoint.h"
#include "server/rpc/credentials.h"
#include "server/rpc/group_communicators.h"
#include "server/rpc/metrics.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/rendezvous.h"
#include "server/rpc/server.h"

namespace optstep {

// One optimizer-server rank: its engine, its place in the group, its gRPC server and its
// /metrics endpoint, from start to shutdown. optstep_server's main parses the flags into Options
// and runs one (docs/configuration.md describes each flag):
//
//   RankProcess::HandleSignals();
//   auto process = RankProcess::Start(options);   // serving; joins the group in the background
//   (*process)->WaitForShutdown();                // SIGTERM, SIGINT or AdminService.Shutdown
//
// A rank that loses a peer exits with kPeerLossExitCode (docs/deploy.md, "Failure handling")
// unless the group heals it: a restarted rank rejoins, and a rank other than 0 that does not
// return is stood in for by its buddy, in the buddy's process (rank_process_stand_in.cc); rank 0
// restores the sessions of its automatic checkpoints before it serves.
//
// Shutdown: health turns NOT_SERVING, running calls get `shutdown_grace` to finish, then (rank 0,
// with `checkpoint_on_shutdown`) every session is saved, and the engine stops.
// Thread-safe.
class RankProcess {
 public:
  struct Options {
    // Where the gRPC server listens; port 0 picks a free port.
    std::string host = "0.0.0.0";
    int port = 50051;
    // Host the other ranks and trainers reach this rank at (also Gloo's interface); empty:
    // `host` unless it is a wildcard address, else this machine's hostname.
    std::string advertise_host;
    // The engine's device ("cpu", "cuda", "cuda:N", "auto") and CPU threads (0: all cores).
    std::string device = "cpu";
    int num_threads = 0;
    // This rank's place in its group; `rendezvous` is rank 0's host:port (ranks other than 0
    // when world_size > 1).
    int rank = 0;
    int world_size = 1;
    std::string rendezvous;
    // Collectives between ranks: "auto", "gloo" or "nccl"; bound on rendezvous and collectives.
    std::string comm = "auto";
    absl::Duration comm_timeout = absl::Minutes(5);
    // Engine limits (EngineOptions).
    absl::Duration step_deadline = absl::Minutes(1);
    int max_sessions = 64;
    int64_t max_params_per_session = 1 << 20;
    int64_t max_session_bytes = 0;
    int max_sessions_per_owner = 0;   // 0: max_sessions alone
    double owner_memory_share = 1.0;  // 1: the budget alone
    int64_t memory_budget = 0;        // 0: ResolveMemoryBudget's default
    int64_t memory_headroom = 0;      // 0: DefaultStreamHeadroom
    // Time running calls get to finish once shutdown is requested.
    absl::Duration shutdown_grace = absl::Seconds(10);
    // Save / Load checkpoints; empty: they answer FAILED_PRECONDITION. 0 keeps every one.
    std::string checkpoint_root;
    int keep_checkpoints = 0;
    // At start, the temporaries of saves in `checkpoint_root` in which nothing changed for this
    // long are removed (SweepStaleCheckpointTemporaries); zero: none are.
    absl::Duration checkpoint_temp_max_age = absl::Hours(1);
    int max_message_bytes = (4 << 20) + (64 << 10);
    // --stream_window_bytes (ServerOptions::stream_window_bytes).
    int stream_window_bytes = 16 << 20;
    // Bounds on each Step stream before its commit (StepStreamLimits): bytes (0: twice the
    // session's gradient bytes on this rank) and time waiting on the trainer (zero: none).
    int64_t max_stream_bytes = 0;
    absl::Duration stream_idle_timeout = absl::Minutes(1);
    // --max_headerless_step_streams (StepStreamLimits::max_headerless_per_caller).
    int max_headerless_step_streams = LiveStepStreams::kDefaultMaxHeaderlessPerCaller;
    // A device task running longer than this turns health NOT_SERVING (zero: no watchdog).
    absl::Duration device_watchdog = absl::Minutes(5);
    // Trainers on this host may share a memory segment with the rank for their steps
    // (AttachSharedMemory).
    bool shared_memory = true;
    int max_shared_segments = 1024;  // --max_shared_segments
    // Heartbeats between the ranks: each pings the others every `heartbeat_interval`; a rank
    // that has not answered for `peer_timeout` is lost (health NOT_SERVING, calls UNAVAILABLE).
    absl::Duration heartbeat_interval = absl::Seconds(1);
    absl::Duration peer_timeout = absl::Seconds(5);
    // TLS and bearer tokens (docs/security.md); all empty: plaintext, no tokens.
    TlsFiles tls;
    std::string auth_tokens_file;
    // Mutual TLS without tokens only: the client certificates' common names that have the peer
    // role (empty: the common name of `tls.cert_file`) and the admin role (empty: none).
    std::vector<std::string> peer_subjects;
    std::vector<std::string> admin_subjects;
    // /metrics: 0 off, -1 any free port; the bound port is written to `metrics_port_file` when
    // set.
    int metrics_port = 0;
    std::string metrics_port_file;
    // Rank 0, on shutdown after the running step: every session is saved as checkpoint
    // "<checkpoint_on_shutdown>-<session id>". Needs `checkpoint_root`.
    std::string checkpoint_on_shutdown;
    // Rank 0's automatic checkpoints (AutoCheckpointOptions): every this many applied steps, or
    // this long, whichever comes first (0 / zero: not by that); both off: none. Need
    // `checkpoint_root`. Sessions found there are restored at start whatever these say.
    int checkpoint_every_steps = 0;
    absl::Duration checkpoint_every = absl::ZeroDuration();
    int keep_auto_checkpoints = 2;
    // A rank that finds a peer lost, or one of whose sessions lost its group (its collectives
    // failed) exits with kPeerLossExitCode `peer_loss_exit_grace` later, for its supervisor to
    // restart the group. A rank whose group does not form exits so whatever this says.
    bool exit_on_peer_loss = false;
    absl::Duration peer_loss_exit_grace = absl::Seconds(1);
    // 1: one lost rank (rank 0 too) is waited for, up to `rejoin_timeout`, and healed back into
    // the running group when it restarts (heal.h); 0: any loss restarts the group; -1: 1 with
    // several ranks.
    int state_redundancy = -1;
    absl::Duration rejoin_timeout = absl::Seconds(60);
    // With state redundancy: a rank still lost after `rejoin_timeout` is stood in for by its
    // buddy (rank + 1), in the buddy's process, until its own process rejoins (rank 0 only in
    // groups of three ranks or more; docs/deploy.md, "A rank that does not return"); every
    // survivor then waits another `rejoin_timeout` (at least 30 s) for the stand-in's heal
    // before it exits. It listens on `stand_in_port` (0: any free port).
    bool stand_ins = true;
    int stand_in_port = 0;
    // Testing only (a rank lost while a step runs): this rank SIGKILLs itself once it has
    // stepped its own parameters (and shipped their gradients to its buddy) in its
    // `kill_before_allgather`-th step of any session, before that step's all-gather. 0: never.
    int kill_before_allgather = 0;
    // Testing only (a rank lost once a step's all-gather completed on it): as above, once the
    // all-gather of that step completed here, before its trainers are answered. 0: never.
    int kill_after_allgather = 0;
    // Testing only (a collective cut on this rank alone): the `fail_allgather_after`-th
    // all-gather of any session completes and is answered as failed here (FailAllGatherAfter).
    int fail_allgather_after = 0;
    // Testing only (a rank lost while rank 0 restores the group): rank 0 SIGKILLs itself once the
    // first session of its automatic checkpoints is recreated on every rank, before it loads;
    // another rank once its first session (a replica rank 0 restores) is made.
    bool kill_during_restore = false;
    // Testing only (a close cut by the loss of rank 0): rank 0 SIGKILLs itself once it closed a
    // session's replica here, after every other rank dropped theirs, before it answers.
    bool kill_during_close = false;
    // Testing only (a rank lost while it heals in): a restarted rank SIGKILLs itself at its first
    // communicator rendezvous ("rendezvous": its heal's first replica, before the peers see it),
    // or once its heal fetched the first state dict from a peer ("transfer"); empty: never.
    std::string kill_during_heal;
    // --delay_heal_fetch_ms: a pause after each state dict fetched while healing in.
    absl::Duration delay_heal_fetch = absl::ZeroDuration();
    // --drop_first_peer_call: "CALL:RANK", the first attempt of that call to that rank that this
    // rank drops (RankGroupOptions::drop_peer_call); "CALL:RANK:every", every attempt of the
    // first such call, which the rank then misses for good; empty: none.
    std::string drop_first_peer_call;
    // --delay_rejoin_ms: rank 0's pause before it heals in a rank that asked to rejoin.
    absl::Duration delay_rejoin = absl::ZeroDuration();
    // Testing only (a host lost mid-save): this rank stops itself (SIGSTOP) as it begins writing
    // its shard of a checkpoint for rank 0 (PeerService.SaveShard).
    bool hang_in_save_shard = false;
    // A stand-in's, started while rank 0 is stood in for: that stand-in's store, where the group
    // is found (RankGroup::HearOfRendezvous; FindsRunningGroup). Not a flag; empty: none.
    std::string heard_rendezvous;
  };

  // The exit status of a rank that left because its group broke (EX_TEMPFAIL): restart it.
  static constexpr int kPeerLossExitCode = 75;

  // Routes SIGTERM and SIGINT of this process to the RankProcess started next: each requests its
  // shutdown, as Shutdown() does. A signal that arrives before Start is kept until then. Call
  // once, from main, before any thread starts.
  static void HandleSignals();

  // Checks `options`, creates the engine, starts the gRPC server (and /metrics), prints
  // "listening on <host>:<port> (...)" on stdout, and starts joining the group in the
  // background: health turns SERVING once joined. INVALID_ARGUMENT for inconsistent options;
  // else the status of the part that could not start.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Start(Options options);

  // Requests the shutdown (as AdminService.Shutdown does) and waits for it.
  ~RankProcess();
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  // The port the gRPC server listens on, and that of /metrics (0: none).
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }

  // Requests the shutdown and returns at once. Idempotent.
  void Shutdown();

  // Blocks until a shutdown was requested (Shutdown, a handled signal or AdminService.Shutdown)
  // and carried out: the server stopped, the shutdown checkpoints written, the engine stopped.
  void WaitForShutdown();

 private:
  // `host_budget`: a stand-in's for a lost rank, in its buddy's process (StartStandIn): the
  // buddy's memory budget, which it shares; null for a rank's own process.
  RankProcess(Options options, const MemoryBudget* host_budget);
  static absl::StatusOr<std::unique_ptr<RankProcess>> StartProcess(Options options,
                                                                   const MemoryBudget* host_budget);

  // Everything Start does once the object exists.
  absl::Status Launch();
  absl::Status StartEngine(const std::shared_ptr<grpc::ChannelCredentials>& peer_credentials);
  absl::Status StartMetrics();
  // Removes the stale temporaries of saves from the checkpoint root; a failure is logged.
  void SweepCheckpointRoot();
  // Joins the group, restores the sessions of the automatic checkpoints (rank 0), then turns
  // health SERVING (the join thread).
  void JoinGroup(const std::string& address, std::shared_ptr<GrpcKeyValueStore> store);
  // Until the shutdown request: exits for a restart (ExitForRestart) once a session's
  // collectives failed (a broken session; with a heal, one interrupted by a lost peer waits for
  // the heal), two peers are lost, or a lost peer or an interrupted session has not healed within
  // `rejoin_timeout` (an interrupted step gets another one once the peer healed in). With stand-ins
  // a rank other than 0 lost that long is stood in for by its buddy (StartStandIn) and the
  // survivors wait as long again; the buddy stops the stand-in once the rank's own process is
  // back (EndStandInOnceReplaced). The join thread, several ranks, `exit_on_peer_loss` or
  // stand-ins.
  void WatchSessionGroups();
  // A rank other than 0 of a group that heals, before it joins: whether its group formed
  // already (it restarted, and rejoins), at rank 0's configured store or, while a stand-in serves
  // for a lost rank 0, at the stand-in's, which the survivors' heartbeats tell of
  // (RankGroup::heard_rendezvous; `store` then points there). Polls every heartbeat interval,
  // at most `comm_timeout`, until one of them answers. False for a group yet to form.
  bool FindsRunningGroup(GrpcKeyValueStore* store);
  // A restarted rank > 0 whose group runs: asks rank 0 to heal it in. False when it could not
  // (it exits for a restart).
  bool RejoinGroup(const std::string& address);
  // Rank 0 of a group that heals, joined: heals itself into the group the other ranks kept
  // (HealRankZero), setting `healed`, or finds the group new. False when it could not (it exits
  // for a restart).
  bool RejoinAsRankZero(bool* healed);
  // A rank other than 0 of a group that heals, until the shutdown request (the publish thread):
  // while rank 0 of the formed group is lost or gone (RankGroup::AwaitsRankZero), publishes
  // `address` in the store again at every heartbeat interval, for rank 0's next process to find.
  void PublishForRankZero(const std::string& address);
  // Whether the survivors wait for lost rank `rank` to rejoin rather than restart the group (one
  // rank lost in a group that heals; rank 0 only once the group formed).
  bool AwaitsRejoin(int rank) const;
  // Whether this group heals a restarted rank (`state_redundancy` resolved).
  bool heals() const;

  // ---- Standing in for a lost rank (rank_process_stand_in.cc) ----

  // Whether lost rank `rank` (the only one lost: LostPeer) is stood in for once `rejoin_timeout`
  // passed.
  bool StoodInWhenLost(int rank) const;
  // How long the survivors then wait for the stand-in to start and heal in: `rejoin_timeout`
  // again, and at least kMinStandInWait (a heal of large sessions on a loaded host).
  absl::Duration StandInWait() const;
  static constexpr absl::Duration kMinStandInWait = absl::Seconds(30);
  // How many heartbeat intervals a stand-in that stopped waits before the next one starts.
  static constexpr int kStandInRestartPause = 10;
  // The only lost peer, or -1.
  int LostPeer() const;
  // This rank, buddy of lost rank `rank`: starts a stand-in for it in this process, sharing
  // this rank's memory budget, which heals itself into the group as a restarted rank does. A
  // failure is logged (the survivors' wait then ends in a restart of the group).
  void StartStandIn(int rank);
  // Once the stood-in rank's own process has rejoined (the group knows it at another address
  // than the stand-in's), stops the stand-in (EndStandIn); also once that process was lost in
  // its heal, and then stands in again after the rejoin timeout. For rank 0, once its own process
  // serves its store: that process heals itself in after the stand-in stopped.
  void EndStandInOnceReplaced();
  // Stops the stand-in without telling the peers, and frees its budget; a later loss of the rank
  // is stood in for again.
  void EndStandIn();
  // Rank 1: whether a new process of rank 0 serves rank 0's configured store (it published its
  // address and formed no group yet): it heals itself in, and no stand-in may run beside it.
  bool RankZeroProcessBack();
  // `exit_on_peer_loss` (or `even_without_flag`): the process exits with kPeerLossExitCode after
  // the grace. Once.
  void ExitForRestart(const std::string& why, bool even_without_flag = false);
  // Waits for a shutdown request, then stops the server and saves the sessions (the shutdown
  // thread).
  void AwaitShutdownRequest();
  // `checkpoint_on_shutdown`: every session, once no step runs any more. A failure is logged.
  void SaveOnShutdown();
  // The rendezvous store, once the server listens (null before, and with one rank).
  std::shared_ptr<GrpcKeyValueStore> store() const;
  // Stops what has started, in reverse order; the threads must have ended.
  void Stop();

  const Options options_;
  // A self-pipe of shutdown requests: a signal writes its number, Shutdown() writes 0; the
  // shutdown thread reads one byte. Owned, unless it is the signal pipe of HandleSignals.
  int request_pipe_[2] = {-1, -1};
  bool owns_request_pipe_ = false;

  mutable absl::Mutex store_mu_;
  std::shared_ptr<GrpcKeyValueStore> store_ ABSL_GUARDED_BY(store_mu_);
  // The collectives' kind and device, known once the engine (and so its device) exists.
  CommunicatorOptions comm_template_;
  // The all-gathers every session's communicator completed (--fail_allgather_after).
  const std::shared_ptr<std::atomic<int>> allgathers_ = std::make_shared<std::atomic<int>>(0);

  // Declared in the order they start; stopped in reverse.
  std::shared_ptr<ServerMetrics> metrics_;
  std::unique_ptr<GroupCommunicators> communicators_;  // several ranks
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<AutoCheckpointer> auto_checkpointer_;  // rank 0 with automatic checkpoints
  std::unique_ptr<Server> server_;
  int port_ = 0;
  int metrics_port_ = 0;
  absl::Notification shutdown_requested_;
  // The group formed (JoinGroup). A signal before it ends the process at once with 128 + signal.
  absl::Notification joined_;
  // JoinGroup returned, the group formed or not (a stand-in's returns once it healed in or failed).
  absl::Notification join_ended_;
  std::thread join_thread_;
  std::thread shutdown_thread_;
  std::thread publish_thread_;  // ranks other than 0 of a group that heals

  // This process is a stand-in (in its buddy's process): it never ends the process, takes no
  // signal, serves no /metrics, and leaves without telling its peers when its rank's own process
  // took its place (`announce_leave_` false). Its step streams still open then can never
  // complete: its server ends them without waiting out `shutdown_grace`. It admits its sessions
  // into its host's memory budget (`host_budget_`, which the host's engine outlives it with).
  bool is_stand_in() const { return host_budget_ != nullptr; }
  const MemoryBudget* const host_budget_ = nullptr;
  std::atomic<bool> announce_leave_{true};
  // A stand-in serving in its rank's place asked for a restart of the group (ExitForRestart: the
  // heal of another rank failed for good while it stands in for rank 0, rank 0's own heal failed
  // for good): its host exits for its supervisor, losing two ranks, so that the group restarts.
  std::atomic<bool> restart_requested_{false};
  // Rank 1 standing in for rank 0: rank 0's configured store, where its own process returns.
  std::unique_ptr<GrpcKeyValueStore> rank_zero_probe_;
  // The stand-in this rank runs for its predecessor (it shares this rank's memory budget), its
  // address, and whether one was started since the predecessor was lost. Touched by the join
  // thread (the watch loop), then by Stop once it ended.
  std::unique_ptr<RankProcess> stand_in_;
  std::string stand_in_address_;
  bool stand_in_started_ = false;
  // When the last stand-in stopped: the next one starts kStandInRestartPause after it at the
  // earliest, so that one failing at once is not started again at every heartbeat.
  absl::Time stand_in_ended_at_ = absl::InfinitePast();

  absl::Mutex wait_mu_;
  bool stopped_ ABSL_GUARDED_BY(wait_mu_) = false;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RANK_PROCESS_H_
