// optstep_server: one optimizer-server rank.
//
//   optstep_server --port=0 --device=cpu                                 (one rank)
//   optstep_server --rank=0 --world_size=2 --port=7000                   (rank 0 of two)
//   optstep_server --rank=1 --world_size=2 --rendezvous=host0:7000       (rank 1)
//
// Prints "listening on <host>:<port>" once serving. Health turns SERVING once the rank has
// joined its group. SIGTERM / SIGINT, or AdminService.Shutdown from an admin: health turns
// NOT_SERVING, running calls get --shutdown_grace_ms to finish, then the process exits 0.

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "kernels/comm/communicator.h"
#include "server/engine/engine.h"
#include "server/rpc/auth.h"
#include "server/rpc/credentials.h"
#include "server/rpc/metrics.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/rendezvous.h"
#include "server/rank_env.h"
#include "server/rpc/server.h"

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
ABSL_FLAG(int, world_size, 0, "Number of ranks; 0: $WORLD_SIZE, else 1.");
ABSL_FLAG(std::string, rendezvous, "",
          "host:port of rank 0 (ranks other than 0 when world_size > 1).");
ABSL_FLAG(std::string, comm, "auto", "Collectives between ranks: auto, gloo or nccl.");
ABSL_FLAG(int64_t, comm_timeout_ms, 300000, "Rendezvous and collective timeout.");
ABSL_FLAG(int64_t, step_deadline_ms, 60000,
          "Default step deadline: a step still incomplete this long after it began is aborted.");
ABSL_FLAG(int, max_sessions, 64, "Most sessions held at once.");
ABSL_FLAG(int64_t, max_params_per_session, 1 << 20, "Most parameters in one session.");
ABSL_FLAG(int64_t, max_session_bytes, 0,
          "Most bytes of masters, gradients and optimizer state per session; 0 = no limit.");
ABSL_FLAG(int64_t, shutdown_grace_ms, 10000, "Time running calls get to finish on SIGTERM.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory of Save / Load checkpoints (the same shared file system on every rank); "
          "empty: Save and Load answer FAILED_PRECONDITION.");
ABSL_FLAG(int, keep_checkpoints, 0, "Complete checkpoints Save keeps in --checkpoint_root; 0 = all.");
ABSL_FLAG(int, max_message_bytes, (4 << 20) + (64 << 10),
          "Largest gRPC message received or sent; a larger one fails with RESOURCE_EXHAUSTED. "
          "Must hold a 4 MiB chunk plus its envelope for full-size chunks.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this rank: TLS on its port, and its client certificate "
          "towards the other ranks. Unset (with --tls_key): plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: every client must present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the other ranks' certificates; default --tls_client_ca.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens, one 'TOKEN [user|admin]' a line; set: every call but health "
          "needs one (admin calls an admin token). Requires TLS. The ranks call each other with "
          "the first admin token.");
ABSL_FLAG(int, metrics_port, 0,
          "Port of the Prometheus /metrics endpoint (on --host); 0: off, -1: any free port.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port to this file once serving (for tests and sidecars).");
ABSL_FLAG(std::string, checkpoint_on_shutdown, "",
          "On SIGTERM (rank 0), after the running step: save every session as checkpoint "
          "'<name>-<session id>' under --checkpoint_root. The other ranks must still serve.");
ABSL_FLAG(std::string, log_level, "info", "Least severe log line written: debug, info, warning "
          "or error.");

namespace optstep {

// SIGTERM / SIGINT (and AdminService.Shutdown, as byte 0) write a byte to this pipe; a thread
// waits on it and shuts the server down.
// (A self-pipe works whatever signal masks the libraries' threads set.)
int signal_pipe[2] = {-1, -1};

void OnSignal(int signal) {
  const char byte = static_cast<char>(signal);
  (void)!write(signal_pipe[1], &byte, 1);
}

void InstallSignalHandlers() {
  if (pipe(signal_pipe) != 0) return;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

namespace {

// $NAME, when set.
std::optional<absl::string_view> Env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return absl::string_view(value);
}

std::string AdvertiseHost() {
  std::string host = absl::GetFlag(FLAGS_advertise_host);
  if (!host.empty()) return host;
  host = absl::GetFlag(FLAGS_host);
  if (host != "0.0.0.0" && host != "::" && host != "[::]") return host;
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
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

TlsFiles TlsFromFlags() {
  TlsFiles tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  return tls;
}

// Serves /metrics when --metrics_port asks for it; answers the bound port (0: off).
absl::StatusOr<int> ServeMetrics(ServerMetrics& metrics, const std::string& host, Engine* engine) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port == 0) return 0;
  absl::Status serving = metrics.Serve(host, port < 0 ? 0 : port, engine);
  if (!serving.ok()) return serving;
  const std::string port_file = absl::GetFlag(FLAGS_metrics_port_file);
  if (!port_file.empty()) {
    std::ofstream out(port_file);
    out << metrics.port() << "\n";
    if (!out) {
      return absl::InternalError(
          absl::StrCat("cannot write --metrics_port_file '", port_file, "'"));
    }
  }
  return metrics.port();
}

// --checkpoint_on_shutdown: every session of rank 0, once no step runs any more. A failure is
// logged; the process still exits.
void SaveOnShutdown(Engine& engine, RankGroup& group) {
  const std::string name = absl::GetFlag(FLAGS_checkpoint_on_shutdown);
  if (name.empty()) return;
  for (const std::shared_ptr<Session>& session : engine.ListSessions()) {
    const std::string checkpoint = absl::StrCat(name, "-", session->id());
    auto step = group.SaveCheckpoint(*session, checkpoint, nullptr);
    if (step.ok()) {
      LOG(INFO) << "event=shutdown_checkpoint session=" << session->id() << " step=" << *step
                << " name=" << checkpoint;
    } else {
      LOG(ERROR) << "event=shutdown_checkpoint_failed session=" << session->id()
                 << " name=" << checkpoint << " error=\"" << step.status().message() << "\"";
    }
  }
}

int Run() {
  if (!ApplyLogLevel(absl::GetFlag(FLAGS_log_level))) {
    LOG(ERROR) << "--log_level='" << absl::GetFlag(FLAGS_log_level)
               << "' is not one of debug, info, warning, error";
    return 1;
  }
  const absl::StatusOr<int> resolved_rank = ResolveRank(absl::GetFlag(FLAGS_rank), Env("POD_NAME"));
  const absl::StatusOr<int> resolved_world =
      ResolveWorldSize(absl::GetFlag(FLAGS_world_size), Env("WORLD_SIZE"));
  for (const absl::Status& status : {resolved_rank.status(), resolved_world.status()}) {
    if (!status.ok()) {
      LOG(ERROR) << status.message();
      return 1;
    }
  }
  const int rank = *resolved_rank;
  const int world = *resolved_world;
  if (!absl::GetFlag(FLAGS_checkpoint_on_shutdown).empty() &&
      absl::GetFlag(FLAGS_checkpoint_root).empty()) {
    LOG(ERROR) << "--checkpoint_on_shutdown needs --checkpoint_root";
    return 1;
  }
  if (rank < 0 || rank >= world) {
    LOG(ERROR) << "rank " << rank << " is not in [0, " << world << ")";
    return 1;
  }
  if (world > 1 && rank > 0 && absl::GetFlag(FLAGS_rendezvous).empty()) {
    LOG(ERROR) << "rank " << rank << " of " << world << " needs --rendezvous=<rank 0 host:port>";
    return 1;
  }
  const std::string advertise_host = AdvertiseHost();
  const absl::Duration comm_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_comm_timeout_ms));

  EngineOptions engine_options;
  engine_options.device.kind = absl::GetFlag(FLAGS_device);
  engine_options.device.num_threads = absl::GetFlag(FLAGS_num_threads);
  engine_options.rank = rank;
  engine_options.world_size = world;
  engine_options.default_step_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_step_deadline_ms));
  engine_options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  engine_options.max_params_per_session = absl::GetFlag(FLAGS_max_params_per_session);
  engine_options.max_session_bytes = absl::GetFlag(FLAGS_max_session_bytes);

  ServerOptions server_options;
  server_options.host = absl::GetFlag(FLAGS_host);
  server_options.port = absl::GetFlag(FLAGS_port);
  server_options.serve_rendezvous = world > 1 && rank == 0;
  server_options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  server_options.tls = TlsFromFlags();
  std::string peer_token;
  if (!absl::GetFlag(FLAGS_auth_tokens_file).empty()) {
    auto tokens = TokenTable::Load(absl::GetFlag(FLAGS_auth_tokens_file));
    if (!tokens.ok()) {
      LOG(ERROR) << "--auth_tokens_file: " << tokens.status();
      return 1;
    }
    peer_token = tokens->FirstAdminToken();
    if (world > 1 && peer_token.empty()) {
      LOG(ERROR) << "--auth_tokens_file has no admin token: the " << world
                 << " ranks call each other with the first admin token";
      return 1;
    }
    server_options.tokens = *std::move(tokens);
  }
  auto peer_credentials = MakePeerCredentials(server_options.tls, peer_token);
  if (!peer_credentials.ok()) {
    LOG(ERROR) << peer_credentials.status();
    return 1;
  }
  auto metrics = std::make_shared<ServerMetrics>();
  engine_options.step_observer = metrics;
  server_options.metrics = metrics.get();
  // AdminService.Shutdown takes the SIGTERM path (byte 0: no signal).
  server_options.on_shutdown_request = [](const std::string&) { OnSignal(0); };

  // Rank 0's store is reached through its own port, known once the server listens; the
  // communicators are created only after that (at the first session).
  std::shared_ptr<GrpcKeyValueStore> store;
  std::string store_target = absl::GetFlag(FLAGS_rendezvous);
  // The collectives' kind and device follow the engine's device, known once it is created.
  auto comm_template = std::make_shared<CommunicatorOptions>();
  if (world > 1) {
    engine_options.make_communicator = [&store, rank, world, advertise_host, comm_timeout,
                                        comm_template](const std::string& session_id) {
      CommunicatorOptions options = *comm_template;
      options.rank = rank;
      options.world_size = world;
      options.prefix = session_id;
      options.store = store;
      options.hostname = advertise_host;
      options.timeout = comm_timeout;
      return CreateCommunicator(options);
    };
  }
  auto engine = Engine::Create(engine_options);
  if (!engine.ok()) {
    LOG(ERROR) << "cannot start the engine: " << engine.status();
    return 1;
  }
  if (world > 1) {
    absl::Status comm = ResolveCommunicatorKind(absl::GetFlag(FLAGS_comm),
                                                (*engine)->device().name(), comm_template.get());
    if (!comm.ok()) {
      LOG(ERROR) << "--comm=" << absl::GetFlag(FLAGS_comm) << ": " << comm.message();
      return 1;
    }
  }
  RankGroupOptions group_options;
  group_options.rank = rank;
  group_options.world_size = world;
  group_options.timeout = comm_timeout;
  group_options.peer_credentials = *peer_credentials;
  group_options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  group_options.keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
  RankGroup group(group_options, engine->get());

  auto server = Server::Start(server_options, engine->get(), &group);
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    return 1;
  }
  const std::string address = absl::StrCat(advertise_host, ":", (*server)->port());
  if (world > 1) {
    if (rank == 0) store_target = address;
    store = std::make_shared<GrpcKeyValueStore>(store_target, *peer_credentials);
  }
  absl::StatusOr<int> metrics_port = ServeMetrics(*metrics, server_options.host, engine->get());
  if (!metrics_port.ok()) {
    LOG(ERROR) << metrics_port.status();
    metrics->StopServing();
    return 1;
  }
  std::cout << "listening on " << server_options.host << ":" << (*server)->port() << " (device "
            << (*engine)->device().name() << ", rank " << rank << " of " << world
            << (*metrics_port > 0 ? absl::StrCat(", metrics port ", *metrics_port) : "")
            << (server_options.tls.enabled() ? ", tls" : "") << ")" << std::endl;

  std::thread join_thread([&] {
    absl::Status joined = group.Join(address, store);
    if (!joined.ok()) {
      LOG(ERROR) << "rank " << rank << " could not join its group: " << joined;
      return;
    }
    LOG(INFO) << "rank " << rank << " of " << world << " ready at " << address;
    (*server)->SetReady(true);
  });
  std::thread signal_thread([&] {
    char signal = 0;
    while (read(signal_pipe[0], &signal, 1) < 0 && errno == EINTR) {
    }
    if (signal == 0) {
      LOG(INFO) << "Shutdown requested: shutting down";
    } else {
      LOG(INFO) << "signal " << static_cast<int>(signal) << ": shutting down";
    }
    (*server)->Shutdown(absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
    if (rank == 0) SaveOnShutdown(*engine->get(), group);
  });
  (*server)->Wait();
  signal_thread.join();
  join_thread.join();
  server->reset();
  metrics->StopServing();
  engine->reset();
  LOG(INFO) << "stopped";
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  optstep::InstallSignalHandlers();
  absl::SetProgramUsageMessage("optstep_server --port=PORT [--device=cpu] [--rank=R --world_size=N "
                               "--rendezvous=HOST:PORT]: an optimizer-server rank");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return optstep::Run();
}
