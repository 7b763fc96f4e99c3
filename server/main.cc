// optstep_server: one optimizer-server rank.
//
//   optstep_server --port=0 --device=cpu                                 (one rank)
//   optstep_server --rank=0 --world_size=2 --port=7000                   (rank 0 of two)
//   optstep_server --rank=1 --world_size=2 --rendezvous=host0:7000       (rank 1)
//
// Prints "listening on <host>:<port>" once serving. Health turns SERVING once the rank has
// joined its group. SIGTERM / SIGINT, or AdminService.Shutdown from an admin: health turns
// NOT_SERVING, running calls get --shutdown_grace_ms to finish, then the process exits 0.

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/memory_budget.h"
#include "server/rank_env.h"
#include "server/rank_process.h"
#include "server/rpc/auth.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(std::string, advertise_host, "",
          "Host the other ranks and trainers reach this rank at (also Gloo's interface); "
          "default: --host unless it is 0.0.0.0, else this machine's hostname.");
ABSL_FLAG(std::string, device, "cpu", "Device: cpu, cuda, cuda:N or auto.");
ABSL_FLAG(int, num_threads, 0, "CPU device threads; 0 = all cores.");
ABSL_FLAG(int, rank, -1,
          "This rank; -1: the ordinal of $POD_NAME (a StatefulSet pod 'optstep-3' is rank 3), "
          "else 0.");
ABSL_FLAG(int, world_size, 0, "Number of ranks; 0: $OPTSTEP_WORLD_SIZE, else 1.");
ABSL_FLAG(std::string, rendezvous, "",
          "host:port of rank 0 (ranks other than 0 when world_size > 1).");
ABSL_FLAG(std::string, comm, "auto", "Collectives between ranks: auto, gloo or nccl.");
ABSL_FLAG(int64_t, comm_timeout_ms, 300000, "Rendezvous and collective timeout.");
ABSL_FLAG(int64_t, step_deadline_ms, 60000,
          "Default step deadline: a step still incomplete this long after it began is aborted.");
ABSL_FLAG(int, max_sessions, 64, "Most sessions held at once.");
ABSL_FLAG(int64_t, max_params_per_session, 1 << 20, "Most parameters in one session.");
ABSL_FLAG(std::string, memory_budget, "",
          "Bytes this rank admits sessions into (a number, or with K, M, G or T: '3G'); empty or "
          "0: 0.8 of the device's memory (CUDA), else of the cgroup's memory limit, else of "
          "physical memory.");
ABSL_FLAG(std::string, memory_headroom, "",
          "Bytes outside the memory budget that streams' copies may hold in their owners' places "
          "(an export's state, staged initial values and imported tensors, unread pulls, "
          "waiting Step streams; the others are taken from the budget), an owner's at most "
          "--owner_memory_share of them; empty or 0: what the memory limit leaves beyond the "
          "budget (on a GPU rank, whose budget is the device's memory: the whole limit).");
ABSL_FLAG(int64_t, max_session_bytes, 0,
          "Most bytes of one session's footprint on a rank (masters, optimizer state, gradients, "
          "overhead, workspace); 0: the memory budget alone.");
ABSL_FLAG(int, max_sessions_per_owner, 0,
          "Most sessions one owner (an authenticated identity) holds at once; 0: --max_sessions "
          "alone.");
ABSL_FLAG(double, owner_memory_share, 1.0,
          "Share of the memory budget one owner's sessions may take together on a rank, in "
          "(0, 1]; 1: the budget alone.");
ABSL_FLAG(int64_t, max_stream_bytes, 0,
          "Most bytes one Step stream may send before its commit; 0: twice the session's "
          "gradient bytes on this rank, plus 1 MiB.");
ABSL_FLAG(int64_t, stream_idle_timeout_ms, 60000,
          "Longest a stream may wait on its caller (a message, or the taking of an answer): "
          "Step, PullParameters, InitParameters, state dict and checkpoint progress streams; "
          "0: no bound.");
ABSL_FLAG(int, max_headerless_step_streams, 64,
          "Most Step streams one caller (its identity on one host; without authentication, its "
          "host) may have open on a rank before they send their StepHeader.");
ABSL_FLAG(int64_t, device_watchdog_ms, 300000,
          "A device task (one slice of a session's device work) running longer than this turns "
          "health NOT_SERVING until it ends; 0: no watchdog.");
ABSL_FLAG(bool, shared_memory, true,
          "Trainers on this host (same user) may share a memory segment with this rank, so that "
          "their steps move no tensor bytes through the socket (AttachSharedMemory).");
ABSL_FLAG(int, max_shared_segments, 1024,
          "Most memory segments this rank shares with trainers at once (each holds a descriptor); "
          "a trainer refused one steps through its stream.");
ABSL_FLAG(int64_t, shutdown_grace_ms, 10000, "Time running calls get to finish on SIGTERM.");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000,
          "Each rank pings every other rank this often (several ranks).");
ABSL_FLAG(int64_t, peer_timeout_ms, 5000,
          "A rank that has not answered a heartbeat for this long is lost: this rank turns "
          "NOT_SERVING and answers UNAVAILABLE naming it.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory of Save / Load checkpoints (the same shared file system on every rank); "
          "empty: Save and Load answer FAILED_PRECONDITION.");
ABSL_FLAG(int64_t, checkpoint_temp_max_age_ms, 3600000,
          "At start, remove the temporaries of saves (hidden '.<name>.tmp' directories) in "
          "--checkpoint_root in which nothing changed for this long; 0: never.");
ABSL_FLAG(int, checkpoint_every_steps, 0,
          "Rank 0 saves every session as an automatic checkpoint (under --checkpoint_root/auto/) "
          "after its first applied step and then every this many applied steps; 0: not by "
          "steps.");
ABSL_FLAG(double, checkpoint_every_seconds, 0,
          "As --checkpoint_every_steps, once this many seconds passed since a session's last "
          "automatic checkpoint (and a step was applied since); 0: not by time. With both set, "
          "whichever comes first.");
ABSL_FLAG(int, keep_auto_checkpoints, 2,
          "Complete automatic checkpoints kept per session (at least 1).");
ABSL_FLAG(bool, exit_on_peer_loss, true,
          "With several ranks: a rank that finds a peer lost, one of whose sessions lost its "
          "group, or whose group does not form, exits with status 75 one second later, for its "
          "supervisor to restart the group (with --state_redundancy=1 a lost rank, rank 0 too once "
          "the group formed, and a session it interrupted, are waited for first).");
ABSL_FLAG(int, state_redundancy, -1,
          "1: a lost rank (rank 0 too) is waited for (--rejoin_timeout_ms) and, restarted with its "
          "ordinal, healed back into the running group, which keeps its sessions; 0: any lost "
          "rank restarts the group; -1: 1 with several ranks.");
ABSL_FLAG(int64_t, rejoin_timeout_ms, 60000,
          "With --state_redundancy=1: how long the other ranks wait for a lost rank to rejoin "
          "before they exit for a restart of the group.");
ABSL_FLAG(bool, stand_in, true,
          "With --state_redundancy=1: a rank still lost after --rejoin_timeout_ms is stood in "
          "for by its buddy (the next rank; rank 0 only with three ranks or more), in the "
          "buddy's process, until its own process returns; the other ranks wait as long again "
          "(at least 30 s) for that before they exit.");
ABSL_FLAG(int, stand_in_port, 0,
          "Port a stand-in this rank runs for its predecessor listens on (--stand_in); 0: any "
          "free port.");
ABSL_FLAG(int, kill_before_allgather, 0,
          "Testing only: this rank SIGKILLs itself in its N-th step (of any session), after it "
          "stepped its own parameters and before the all-gather (a rank lost mid-step); 0: never.");
ABSL_FLAG(int, kill_after_allgather, 0,
          "Testing only: this rank SIGKILLs itself in its N-th step (of any session), once the "
          "step's all-gather completed here and before its trainers are answered; 0: never.");
ABSL_FLAG(int, fail_allgather_after, 0,
          "Testing only: this rank answers its N-th all-gather (of any session) as failed once it "
          "completed, as when its send to a rank that died broke after the data went out; 0: "
          "never.");
ABSL_FLAG(bool, kill_during_restore, false,
          "Testing only: rank 0 SIGKILLs itself while it restores its automatic checkpoints, once "
          "the first session is recreated on every rank and before it loads; another rank once "
          "its first session (a replica rank 0 restores) is made.");
ABSL_FLAG(bool, kill_during_close, false,
          "Testing only: rank 0 SIGKILLs itself as it closes a session, once every other rank "
          "dropped its replica and its own is gone, before it answers.");
ABSL_FLAG(std::string, kill_during_heal, "",
          "Testing only: a restarted rank SIGKILLs itself while it heals into the running group: "
          "'rendezvous' at its first communicator rendezvous, 'transfer' once it fetched the "
          "first state dict from a peer; empty: never.");
ABSL_FLAG(int, delay_heal_fetch_ms, 0,
          "Testing only: a restarted rank pauses this long after each state dict it fetched from "
          "a peer while it heals in, so that its heal outlasts --comm_timeout_ms; 0: never.");
ABSL_FLAG(int, delay_rejoin_ms, 0,
          "Testing only: rank 0 waits this long before it heals in a rank that asked to rejoin "
          "(as when the heal waits for the group's lifecycle lock); 0: never.");
ABSL_FLAG(std::string, drop_first_peer_call, "",
          "Testing only: 'CALL:RANK' (CALL: HealEnd, CloseReplica or HealBegin): this rank drops "
          "its first attempt of that call to rank RANK, as if it were lost on the way (made again "
          "but for HealBegin, which fails the heal); "
          "'CALL:RANK:every': every attempt of the first such call, which rank RANK misses for "
          "good; empty: never.");
ABSL_FLAG(bool, hang_in_save_shard, false,
          "Testing only: this rank stops itself (SIGSTOP) as it begins writing its shard of a "
          "checkpoint for rank 0, as a host lost mid-save (its connections stay up).");
ABSL_FLAG(int, keep_checkpoints, 0,
          "Complete checkpoints Save keeps in --checkpoint_root; 0 = all.");
ABSL_FLAG(int, max_message_bytes, (4 << 20) + (64 << 10),
          "Largest gRPC message received or sent; a larger one fails with RESOURCE_EXHAUSTED. "
          "Must hold a 4 MiB chunk plus its envelope for full-size chunks.");
ABSL_FLAG(int, stream_window_bytes, 16 << 20,
          "HTTP/2 flow-control window of each stream a rank receives: what a caller can make it "
          "buffer for a stream it does not read (a trainer that sends on after its commit, or "
          "one waiting for its turn).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this rank: TLS on its port, and its client certificate "
          "towards the other ranks. Unset (with --tls_key): plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: every client must present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the other ranks' certificates; default --tls_client_ca.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of named identities, one 'NAME ROLE SECRET' a line (ROLE: user, admin or peer); "
          "set: every call but health needs a bearer secret of the role it needs. Requires TLS. "
          "The ranks call each other with the first peer entry's secret.");
ABSL_FLAG(std::string, peer_subjects, "",
          "Mutual TLS without --auth_tokens_file: comma-separated common names (CN) of the client "
          "certificates with the peer role (the ranks' own services, which no other caller may "
          "use). Default: the CN of this rank's --tls_cert.");
ABSL_FLAG(std::string, admin_subjects, "",
          "Mutual TLS without --auth_tokens_file: comma-separated common names (CN) of the client "
          "certificates with the admin role (Save, Load, ImportStateDict, Shutdown; every "
          "session). Default: none. Any other certificate the client CA signed is a user.");
ABSL_FLAG(int, metrics_port, 0,
          "Port of the Prometheus /metrics endpoint (on --host); 0: off, -1: any free port.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port to this file once serving (for tests and sidecars).");
ABSL_FLAG(std::string, checkpoint_on_shutdown, "",
          "On SIGTERM (rank 0), after the running step: save every session as checkpoint "
          "'<name>-<session id>' under --checkpoint_root. The other ranks must still serve.");
ABSL_FLAG(std::string, log_level, "info",
          "Least severe log line written: debug, info, warning "
          "or error.");

namespace optstep {
namespace {

// $NAME, when set.
std::optional<absl::string_view> Env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return absl::string_view(value);
}

// --log_level onto glog: the least severity written; debug also turns on VLOG(1) lines.
bool ApplyLogLevel(const std::string& level) {
  if (level == "debug") {
    FLAGS_minloglevel = google::GLOG_INFO;
    FLAGS_v = 1;
  } else if (level == "info") {
    FLAGS_minloglevel = google::GLOG_INFO;
  } else if (level == "warning") {
    FLAGS_minloglevel = google::GLOG_WARNING;
  } else if (level == "error") {
    FLAGS_minloglevel = google::GLOG_ERROR;
  } else {
    return false;
  }
  return true;
}

// The flags (and, for the rank and world size, $POD_NAME and $OPTSTEP_WORLD_SIZE) as options.
absl::StatusOr<RankProcess::Options> OptionsFromFlags() {
  RankProcess::Options options;
  OPTSTEP_ASSIGN_OR_RETURN(options.rank, ResolveRank(absl::GetFlag(FLAGS_rank), Env("POD_NAME")));
  OPTSTEP_ASSIGN_OR_RETURN(options.world_size, ResolveWorldSize(absl::GetFlag(FLAGS_world_size),
                                                                Env("OPTSTEP_WORLD_SIZE")));
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.device = absl::GetFlag(FLAGS_device);
  options.num_threads = absl::GetFlag(FLAGS_num_threads);
  options.rendezvous = absl::GetFlag(FLAGS_rendezvous);
  options.comm = absl::GetFlag(FLAGS_comm);
  options.comm_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_comm_timeout_ms));
  options.step_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_step_deadline_ms));
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_params_per_session = absl::GetFlag(FLAGS_max_params_per_session);
  options.max_session_bytes = absl::GetFlag(FLAGS_max_session_bytes);
  options.max_sessions_per_owner = absl::GetFlag(FLAGS_max_sessions_per_owner);
  options.owner_memory_share = absl::GetFlag(FLAGS_owner_memory_share);
  if (options.max_sessions_per_owner < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_sessions_per_owner ",
                                                   options.max_sessions_per_owner,
                                                   " must be 0 (no limit) or more"));
  }
  if (!(options.owner_memory_share > 0.0 && options.owner_memory_share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--owner_memory_share ", options.owner_memory_share, " must be in (0, 1]"));
  }
  if (!absl::GetFlag(FLAGS_memory_budget).empty()) {
    OPTSTEP_ASSIGN_OR_RETURN(options.memory_budget,
                             ParseByteCount("--memory_budget", absl::GetFlag(FLAGS_memory_budget)));
  }
  if (!absl::GetFlag(FLAGS_memory_headroom).empty()) {
    OPTSTEP_ASSIGN_OR_RETURN(
        options.memory_headroom,
        ParseByteCount("--memory_headroom", absl::GetFlag(FLAGS_memory_headroom)));
  }
  options.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  options.heartbeat_interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  options.peer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_peer_timeout_ms));
  options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  options.checkpoint_temp_max_age =
      absl::Milliseconds(absl::GetFlag(FLAGS_checkpoint_temp_max_age_ms));
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  if (options.stream_window_bytes < (64 << 10)) {
    return absl::InvalidArgumentError(absl::StrCat("--stream_window_bytes ",
                                                   options.stream_window_bytes,
                                                   " must be at least 65536 (HTTP/2's own)"));
  }
  options.max_stream_bytes = absl::GetFlag(FLAGS_max_stream_bytes);
  options.stream_idle_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_stream_idle_timeout_ms));
  options.max_headerless_step_streams = absl::GetFlag(FLAGS_max_headerless_step_streams);
  if (options.max_headerless_step_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max_headerless_step_streams ",
                                                   options.max_headerless_step_streams,
                                                   " must be at least 1"));
  }
  options.device_watchdog = absl::Milliseconds(absl::GetFlag(FLAGS_device_watchdog_ms));
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.max_shared_segments = absl::GetFlag(FLAGS_max_shared_segments);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.peer_subjects = SplitSubjects(absl::GetFlag(FLAGS_peer_subjects));
  options.admin_subjects = SplitSubjects(absl::GetFlag(FLAGS_admin_subjects));
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  options.checkpoint_on_shutdown = absl::GetFlag(FLAGS_checkpoint_on_shutdown);
  options.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  options.checkpoint_every = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_every_seconds));
  options.keep_auto_checkpoints = absl::GetFlag(FLAGS_keep_auto_checkpoints);
  options.exit_on_peer_loss = absl::GetFlag(FLAGS_exit_on_peer_loss);
  options.state_redundancy = absl::GetFlag(FLAGS_state_redundancy);
  options.rejoin_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rejoin_timeout_ms));
  options.stand_ins = absl::GetFlag(FLAGS_stand_in);
  options.stand_in_port = absl::GetFlag(FLAGS_stand_in_port);
  options.kill_before_allgather = absl::GetFlag(FLAGS_kill_before_allgather);
  options.kill_after_allgather = absl::GetFlag(FLAGS_kill_after_allgather);
  options.fail_allgather_after = absl::GetFlag(FLAGS_fail_allgather_after);
  options.kill_during_restore = absl::GetFlag(FLAGS_kill_during_restore);
  options.kill_during_close = absl::GetFlag(FLAGS_kill_during_close);
  options.kill_during_heal = absl::GetFlag(FLAGS_kill_during_heal);
  options.delay_heal_fetch = absl::Milliseconds(absl::GetFlag(FLAGS_delay_heal_fetch_ms));
  options.drop_first_peer_call = absl::GetFlag(FLAGS_drop_first_peer_call);
  options.delay_rejoin = absl::Milliseconds(absl::GetFlag(FLAGS_delay_rejoin_ms));
  options.hang_in_save_shard = absl::GetFlag(FLAGS_hang_in_save_shard);
  return options;
}

int Run() {
  if (!ApplyLogLevel(absl::GetFlag(FLAGS_log_level))) {
    LOG(ERROR) << "--log_level='" << absl::GetFlag(FLAGS_log_level)
               << "' is not one of debug, info, warning, error";
    return 1;
  }
  absl::StatusOr<RankProcess::Options> options = OptionsFromFlags();
  if (!options.ok()) {
    LOG(ERROR) << options.status().message();
    return 1;
  }
  absl::StatusOr<std::unique_ptr<RankProcess>> process = RankProcess::Start(*std::move(options));
  if (!process.ok()) {
    LOG(ERROR) << process.status().message();
    return 1;
  }
  (*process)->WaitForShutdown();
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  optstep::RankProcess::HandleSignals();
  absl::SetProgramUsageMessage(
      "optstep_server --port=PORT [--device=cpu] [--rank=R --world_size=N "
      "--rendezvous=HOST:PORT]: an optimizer-server rank");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return optstep::Run();
}
