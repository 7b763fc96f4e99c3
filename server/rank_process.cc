#include "server/rank_process.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "base/run_detached.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "kernels/comm/key_value_store.h"
#include "server/engine/step_observer.h"
#include "server/rpc/auth.h"
#include "server/rpc/held_operations.h"
#include "server/testing_faults.h"

namespace optstep {
namespace {

// The shortest wait for a connection to a peer the rendezvous found
// (CommunicatorOptions::connect_timeout): even on a loaded machine a live peer answers within it.
constexpr absl::Duration kMinConnectTimeout = absl::Seconds(5);

// The pipe HandleSignals routes SIGTERM / SIGINT to (a self-pipe works whatever signal masks the
// libraries' threads set), and whether a RankProcess has taken it.
int signal_pipe[2] = {-1, -1};
std::atomic<bool> signal_pipe_taken{false};

void OnSignal(int signal) {
  const char byte = static_cast<char>(signal);
  (void)!write(signal_pipe[1], &byte, 1);
}

std::string DefaultAdvertiseHost(const std::string& host) {
  if (host != "0.0.0.0" && host != "::" && host != "[::]") return host;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

absl::Status CheckOptions(const RankProcess::Options& options) {
  if (!options.checkpoint_on_shutdown.empty() && options.checkpoint_root.empty()) {
    return absl::InvalidArgumentError("--checkpoint_on_shutdown needs --checkpoint_root");
  }
  if ((options.checkpoint_every_steps != 0 || options.checkpoint_every != absl::ZeroDuration()) &&
      options.checkpoint_root.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint_every_steps and --checkpoint_every_seconds need --checkpoint_root");
  }
  if (options.checkpoint_every_steps < 0 || options.checkpoint_every < absl::ZeroDuration() ||
      options.keep_auto_checkpoints < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_every_steps (", options.checkpoint_every_steps,
        ") and --checkpoint_every_seconds (", absl::FormatDuration(options.checkpoint_every),
        ") must not be negative, --keep_auto_checkpoints (", options.keep_auto_checkpoints,
        ") at least 1"));
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.peer_timeout < options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval_ms must be positive and --peer_timeout_ms at least as "
                     "long; got ",
                     absl::FormatDuration(options.heartbeat_interval), " and ",
                     absl::FormatDuration(options.peer_timeout)));
  }
  if (options.state_redundancy < -1 || options.state_redundancy > 1 ||
      options.rejoin_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state_redundancy must be 0 or 1 (or -1: 1 with several ranks), got ",
                     options.state_redundancy, "; --rejoin_timeout_ms must be positive, got ",
                     absl::FormatDuration(options.rejoin_timeout)));
  }
  if (!options.kill_during_heal.empty() &&
      ((options.kill_during_heal != "rendezvous" && options.kill_during_heal != "transfer") ||
       options.world_size == 1 || options.state_redundancy == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kill_during_heal must be empty, 'rendezvous' or 'transfer' (in a group that heals: "
        "several ranks, --state_redundancy not 0), got '",
        options.kill_during_heal, "'"));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", options.world_size, ")"));
  }
  if (options.world_size > 1 && options.rank > 0 && options.rendezvous.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of ",
                                                   options.world_size,
                                                   " needs --rendezvous=<rank 0 host:port>"));
  }
  return absl::OkStatus();
}

// `status` with `context` in front of its message (and its code kept).
absl::Status WithContext(const std::string& context, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(context, status.ToString()));
}

// The bearer tokens of `options` (none without --auth_tokens_file) and the token this rank calls
// the others with.
absl::Status LoadTokens(const RankProcess::Options& options, ServerOptions& server_options,
                        std::string& peer_token) {
  if (options.auth_tokens_file.empty()) return absl::OkStatus();
  auto tokens = TokenTable::Load(options.auth_tokens_file);
  if (!tokens.ok()) return WithContext("--auth_tokens_file: ", tokens.status());
  peer_token = tokens->FirstPeerSecret();
  if (options.world_size > 1 && peer_token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_tokens_file has no peer entry ('NAME peer SECRET'): the ", options.world_size,
        " ranks call each other with the secret of the first peer entry"));
  }
  server_options.tokens = *std::move(tokens);
  return absl::OkStatus();
}

// Under mutual TLS without tokens, the roles of the client certificates by their common names:
// the peers default to this rank's own (one certificate for every rank). The subject flags are
// refused in any other configuration, where they would be ignored.
absl::Status LoadSubjects(const RankProcess::Options& options, ServerOptions& server_options) {
  const bool by_certificate =
      !options.tls.client_ca_file.empty() && options.auth_tokens_file.empty();
  if (!by_certificate) {
    if (options.peer_subjects.empty() && options.admin_subjects.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--peer_subjects and --admin_subjects name roles under mutual TLS without tokens: they "
        "need --tls_client_ca, and --auth_tokens_file unset (its entries name the roles)");
  }
  std::vector<std::string> peers = options.peer_subjects;
  if (peers.empty()) {
    absl::StatusOr<std::string> own = CertificateCommonName(options.tls.cert_file);
    if (!own.ok()) {
      return WithContext("--peer_subjects unset and the peers' subject not read from --tls_cert: ",
                         own.status());
    }
    peers.push_back(*std::move(own));
  }
  absl::StatusOr<SubjectRoles> subjects = SubjectRoles::Make(peers, options.admin_subjects);
  if (!subjects.ok()) return WithContext("--peer_subjects / --admin_subjects: ", subjects.status());
  LOG(INFO) << "event=subject_roles peers=\"" << absl::StrJoin(subjects->peers(), ",")
            << "\" admins=\"" << absl::StrJoin(subjects->admins(), ",")
            << "\" (client certificates of any other common name are users)";
  server_options.subjects = *std::move(subjects);
  return absl::OkStatus();
}

}  // namespace

void RankProcess::HandleSignals() {
  if (pipe(signal_pipe) != 0) return;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

RankProcess::RankProcess(Options options, const MemoryBudget* host_budget)
    : options_(std::move(options)), host_budget_(host_budget) {
  if (!is_stand_in() && signal_pipe[0] >= 0 && !signal_pipe_taken.exchange(true)) {
    request_pipe_[0] = signal_pipe[0];
    request_pipe_[1] = signal_pipe[1];
  } else if (pipe(request_pipe_) == 0) {
    owns_request_pipe_ = true;
  }
}

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Start(Options options) {
  return StartProcess(std::move(options), /*host_budget=*/nullptr);
}

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::StartProcess(
    Options options, const MemoryBudget* host_budget) {
  OPTSTEP_RETURN_IF_ERROR(CheckOptions(options));
  if (options.advertise_host.empty()) options.advertise_host = DefaultAdvertiseHost(options.host);
  std::unique_ptr<RankProcess> process(new RankProcess(std::move(options), host_budget));
  if (process->request_pipe_[0] < 0) {
    return absl::InternalError(absl::StrCat("cannot create a pipe: errno ", errno));
  }
  OPTSTEP_RETURN_IF_ERROR(process->Launch());
  return process;
}

absl::Status RankProcess::Launch() {
  ServerOptions server_options;
  server_options.host = options_.host;
  server_options.port = options_.port;
  server_options.serve_rendezvous = options_.world_size > 1 && options_.rank == 0;
  server_options.max_message_bytes = options_.max_message_bytes;
  server_options.stream_window_bytes = options_.stream_window_bytes;
  server_options.step_stream.max_bytes = options_.max_stream_bytes;
  server_options.step_stream.idle_timeout = options_.stream_idle_timeout;
  server_options.step_stream.max_headerless_per_caller = options_.max_headerless_step_streams;
  server_options.tls = options_.tls;
  std::string peer_token;
  OPTSTEP_RETURN_IF_ERROR(LoadTokens(options_, server_options, peer_token));
  OPTSTEP_RETURN_IF_ERROR(LoadSubjects(options_, server_options));
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> peer_credentials,
                           MakePeerCredentials(options_.tls, peer_token));
  metrics_ = std::make_shared<ServerMetrics>();
  server_options.metrics = metrics_.get();
  // AdminService.Shutdown takes the SIGTERM path (byte 0: no signal).
  server_options.on_shutdown_request = [this](const std::string&) { Shutdown(); };
  OPTSTEP_RETURN_IF_ERROR(StartEngine(peer_credentials));
  SweepCheckpointRoot();

  OPTSTEP_ASSIGN_OR_RETURN(server_, Server::Start(server_options, engine_.get(), group_.get()));
  port_ = server_->port();
  const std::string address = absl::StrCat(options_.advertise_host, ":", port_);
  // Rank 0's store is reached through its own port, known only now; the communicators are
  // created after this (at the first session).
  if (options_.world_size > 1) {
    const std::string target = options_.rank == 0 ? address : options_.rendezvous;
    absl::MutexLock lock(&store_mu_);
    store_ = std::make_shared<GrpcKeyValueStore>(target, peer_credentials);
  }
  OPTSTEP_RETURN_IF_ERROR(StartMetrics());
  std::cout << (is_stand_in() ? "stand-in " : "") << "listening on " << options_.host << ":"
            << port_ << " (device " << engine_->device().name() << ", rank " << options_.rank
            << " of " << options_.world_size
            << (metrics_port_ > 0 ? absl::StrCat(", metrics port ", metrics_port_) : "")
            << (options_.tls.enabled() ? ", tls" : "") << ")" << std::endl;

  join_thread_ = std::thread([this, address] {
    JoinGroup(address, store());
    join_ended_.Notify();
  });
  shutdown_thread_ = std::thread([this] { AwaitShutdownRequest(); });
  if (options_.rank != 0 && heals()) {
    publish_thread_ = std::thread([this, address] { PublishForRankZero(address); });
  }
  return absl::OkStatus();
}

absl::Status RankProcess::StartEngine(
    const std::shared_ptr<grpc::ChannelCredentials>& peer_credentials) {
  EngineOptions engine_options;
  engine_options.device.kind = options_.device;
  engine_options.device.num_threads = options_.num_threads;
  engine_options.rank = options_.rank;
  engine_options.world_size = options_.world_size;
  engine_options.default_step_deadline = options_.step_deadline;
  engine_options.max_sessions = options_.max_sessions;
  engine_options.max_params_per_session = options_.max_params_per_session;
  engine_options.max_session_bytes = options_.max_session_bytes;
  engine_options.max_sessions_per_owner = options_.max_sessions_per_owner;
  engine_options.owner_memory_share = options_.owner_memory_share;
  engine_options.device_watchdog = options_.device_watchdog;
  engine_options.shared_memory = options_.shared_memory;
  engine_options.max_shared_segments = options_.max_shared_segments;
  engine_options.memory_budget = options_.memory_budget;
  engine_options.memory_headroom = options_.memory_headroom;
  engine_options.share_budget_of = host_budget_;
  engine_options.step_observer = metrics_;
  if (options_.kill_before_allgather > 0) {
    engine_options.step_observer =
        std::make_shared<KillAtPhase>(engine_options.step_observer, StepObserver::Phase::kStep,
                                      options_.kill_before_allgather, "kill_before_allgather");
  }
  if (options_.kill_during_restore && options_.rank != 0) {
    engine_options.step_observer =
        std::make_shared<KillAtSessionCreated>(engine_options.step_observer, "kill_during_restore");
  }
  if (options_.kill_during_close && options_.rank == 0) {
    engine_options.step_observer =
        std::make_shared<KillAtSessionClosed>(engine_options.step_observer, "kill_during_close");
  }
  if (options_.kill_after_allgather > 0) {
    engine_options.step_observer =
        std::make_shared<KillAtPhase>(engine_options.step_observer, StepObserver::Phase::kAllGather,
                                      options_.kill_after_allgather, "kill_after_allgather");
  }
  engine_options.state_redundancy = heals();  // a shadow of the predecessor's state, every step
  if (options_.world_size > 1) {
    // Each session's communicator rendezvous under the group's generation (rebuilt by a heal).
    communicators_ = std::make_unique<GroupCommunicators>(
        [this](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
          CommunicatorOptions options = comm_template_;
          options.rank = options_.rank;
          options.world_size = options_.world_size;
          options.prefix = prefix;
          // A rendezvous waits for no rank that is lost (a rank that died in its heal).
          options.store = NewAbandoningKeyValueStore(
              store(),
              [this] { return group_ != nullptr ? group_->MembersStatus() : absl::OkStatus(); },
              std::max(options_.peer_timeout / 2, absl::Milliseconds(100)));
          if (options_.kill_during_heal == "rendezvous") {
            KillSelf("event=killed_during_heal", "kill_during_heal=rendezvous");
          }
          options.hostname = options_.advertise_host;
          options.timeout = options_.comm_timeout;
          // A peer the rendezvous found but that cannot be connected to within a few peer
          // timeouts is lost (it died after publishing its address: a rank killed in its heal).
          options.connect_timeout = std::max(kMinConnectTimeout, 5 * options_.peer_timeout);
          absl::StatusOr<std::unique_ptr<Communicator>> made = CreateCommunicator(options);
          if (!made.ok() || options_.fail_allgather_after <= 0) return made;
          return std::make_unique<FailAllGatherAfter>(*std::move(made), allgathers_,
                                                      options_.fail_allgather_after);
        });
    engine_options.make_communicator = [this](const std::string& session_id) {
      return communicators_->Make(session_id);
    };
  }
  auto engine = Engine::Create(engine_options);
  if (!engine.ok()) return WithContext("cannot start the engine: ", engine.status());
  engine_ = *std::move(engine);
  // The collectives' kind and device follow the engine's device.
  if (options_.world_size > 1) {
    absl::Status comm =
        ResolveCommunicatorKind(options_.comm, engine_->device().name(), &comm_template_);
    if (!comm.ok()) {
      return absl::Status(comm.code(),
                          absl::StrCat("--comm=", options_.comm, ": ", comm.message()));
    }
  }
  RankGroupOptions group_options;
  group_options.rank = options_.rank;
  group_options.world_size = options_.world_size;
  group_options.timeout = options_.comm_timeout;
  group_options.peer_credentials = peer_credentials;
  group_options.checkpoint_root = options_.checkpoint_root;
  group_options.keep_checkpoints = options_.keep_checkpoints;
  group_options.checkpoint_temp_max_age = options_.checkpoint_temp_max_age;
  group_options.heartbeat_interval = options_.heartbeat_interval;
  group_options.peer_timeout = options_.peer_timeout;
  group_options.communicators = communicators_.get();
  group_options.heal = heals();
  group_options.stand_in = is_stand_in();
  group_options.retarget_store = [this](const std::string& target) {
    // Rank 0 (a stand-in too) serves its own store.
    if (options_.rank != 0 && store() != nullptr) {
      store()->Retarget(target.empty() ? options_.rendezvous : target);
    }
  };
  if (options_.kill_during_heal == "transfer") {
    group_options.on_heal_fetched = [] {
      KillSelf("event=killed_during_heal", "kill_during_heal=transfer");
    };
  } else if (options_.delay_heal_fetch > absl::ZeroDuration()) {
    group_options.on_heal_fetched = [delay = options_.delay_heal_fetch] { absl::SleepFor(delay); };
  }
  if (!options_.drop_first_peer_call.empty()) {
    group_options.drop_peer_call = DropPeerCall(options_.drop_first_peer_call);
  }
  if (options_.hang_in_save_shard) {
    group_options.on_save_shard = [] {
      StopSelf("event=stopped_in_save_shard", "hang_in_save_shard=true");
    };
  }
  if (options_.delay_rejoin > absl::ZeroDuration()) {
    group_options.on_rejoin = [delay = options_.delay_rejoin] { absl::SleepFor(delay); };
  }
  group_options.on_heal_failed = [this](const absl::Status& why) {
    ExitForRestart(absl::StrCat("a restarted rank could not be healed in: ", why.message()));
  };
  group_options.on_peer_lost = [this](int rank) {
    metrics_->CountPeerLost();
    if (AwaitsRejoin(rank)) {
      LOG(WARNING) << "event=awaiting_rejoin rank=" << rank
                   << " timeout_s=" << absl::ToDoubleSeconds(options_.rejoin_timeout)
                   << " this rank keeps its sessions until the rank rejoins";
      return;
    }
    ExitForRestart(absl::StrCat("rank ", rank, " lost"));
  };
  AutoCheckpointOptions auto_options;
  auto_options.checkpoint_root = options_.checkpoint_root;
  auto_options.every_steps = options_.checkpoint_every_steps;
  auto_options.every = options_.checkpoint_every;
  auto_options.keep = options_.keep_auto_checkpoints;
  auto_options.temp_max_age = options_.checkpoint_temp_max_age;
  auto_options.on_saved = [metrics = metrics_](const AutoCheckpointSaved&) {
    metrics->CountAutoCheckpoint();
  };
  auto_options.on_failed = [metrics = metrics_](const std::string&, const absl::Status&) {
    metrics->CountAutoCheckpointFailure();
  };
  // Rank 0 with a root: sessions restored from automatic checkpoints lose them when closed, also
  // when no new ones are made.
  const bool auto_checkpoints = options_.rank == 0 && !options_.checkpoint_root.empty();
  if (auto_checkpoints) {
    group_options.on_session_closed = [this](const std::string& id) {
      auto_checkpointer_->SessionClosed(id);
    };
    group_options.replacing_state = [this](const std::string& id, uint64_t from_step,
                                           std::optional<uint64_t> kept_step) {
      return auto_checkpointer_->Replacing(id, from_step, kept_step);
    };
  }
  group_ = std::make_unique<RankGroup>(group_options, engine_.get());
  if (!options_.heard_rendezvous.empty()) group_->HearOfRendezvous(options_.heard_rendezvous);
  if (auto_checkpoints) {
    auto_checkpointer_ =
        std::make_unique<AutoCheckpointer>(auto_options, engine_.get(), group_.get());
  }
  return absl::OkStatus();
}

absl::Status RankProcess::StartMetrics() {
  if (options_.metrics_port == 0) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(metrics_->Serve(
      options_.host, options_.metrics_port < 0 ? 0 : options_.metrics_port, engine_.get()));
  metrics_port_ = metrics_->port();
  if (!options_.metrics_port_file.empty()) {
    std::ofstream out(options_.metrics_port_file);
    out << metrics_port_ << "\n";
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write --metrics_port_file '", options_.metrics_port_file, "'"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<GrpcKeyValueStore> RankProcess::store() const {
  absl::MutexLock lock(&store_mu_);
  return store_;
}

void RankProcess::Shutdown() {
  const char byte = 0;
  (void)!write(request_pipe_[1], &byte, 1);
}

void RankProcess::AwaitShutdownRequest() {
  char signal = 0;
  while (read(request_pipe_[0], &signal, 1) < 0 && errno == EINTR) {
  }
  if (signal == 0) {
    LOG(INFO) << "Shutdown requested: shutting down";
  } else {
    LOG(INFO) << "signal " << static_cast<int>(signal) << ": shutting down";
  }
  if (signal != 0 && options_.world_size > 1 && !joined_.HasBeenNotified()) {
    // Still waiting for the group (up to --comm_timeout_ms): no session exists yet, so nothing is
    // lost by ending now rather than after the wait.
    LOG(WARNING) << "event=shutdown_while_joining signal=" << static_cast<int>(signal)
                 << " code=" << 128 + signal << " the group had not formed; exiting now";
    google::FlushLogFiles(google::GLOG_INFO);
    std::cout.flush();
    _exit(128 + signal);
  }
  // A rank that shuts down judges its peers no more (they may be shutting down too) and tells
  // them it leaves on purpose, before its server stops answering their heartbeats.
  shutdown_requested_.Notify();
  group_->Leave(/*announce=*/announce_leave_.load());
  if (auto_checkpointer_ != nullptr) auto_checkpointer_->Stop();
  // A stand-in that gives way: its steps cannot complete without the group it left (its other
  // calls still get the grace period).
  const bool gives_way = is_stand_in() && !announce_leave_.load();
  const absl::Time deadline = absl::Now() + options_.shutdown_grace;
  server_->Shutdown(deadline, gives_way ? absl::Now() : deadline);
  if (options_.rank == 0) SaveOnShutdown();
}

void RankProcess::SaveOnShutdown() {
  if (options_.checkpoint_on_shutdown.empty()) return;
  for (const std::shared_ptr<Session>& session : engine_->ListSessions()) {
    const std::string checkpoint =
        absl::StrCat(options_.checkpoint_on_shutdown, "-", session->id());
    auto step = HeldOperations(group_.get()).SaveCheckpoint(*session, checkpoint, nullptr);
    if (step.ok()) {
      LOG(INFO) << "event=shutdown_checkpoint session=" << session->id() << " step=" << *step
                << " name=" << checkpoint;
    } else {
      LOG(ERROR) << "event=shutdown_checkpoint_failed session=" << session->id()
                 << " name=" << checkpoint << " error=\"" << LogValue(step.status().message())
                 << "\"";
    }
  }
}

void RankProcess::WaitForShutdown() {
  absl::MutexLock lock(&wait_mu_);
  if (stopped_) return;
  server_->Wait();
  shutdown_thread_.join();
  join_thread_.join();
  if (publish_thread_.joinable()) publish_thread_.join();
  Stop();
  stopped_ = true;
  LOG(INFO) << "stopped";
}

void RankProcess::Stop() {
  stand_in_.reset();  // shuts it down and waits
  server_.reset();
  if (metrics_ != nullptr) metrics_->StopServing();
  auto_checkpointer_.reset();
  // The group before the engine: it detaches its abort-vote listener from the engine.
  group_.reset();
  engine_.reset();
}

RankProcess::~RankProcess() {
  if (shutdown_thread_.joinable()) {
    Shutdown();
    WaitForShutdown();
  } else {
    Stop();  // Start failed part-way: no thread runs
  }
  if (owns_request_pipe_) {
    close(request_pipe_[0]);
    close(request_pipe_[1]);
  }
}

}  // namespace optstep
