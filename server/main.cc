// optstep_server: one optimizer-server rank.
//
//   optstep_server --port=0 --device=cpu
//
// Prints "listening on <host>:<port>" once serving. SIGTERM / SIGINT: health turns NOT_SERVING,
// running calls get --shutdown_grace_ms to finish, then the process exits 0.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "server/engine/engine.h"
#include "server/rpc/server.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(std::string, device, "cpu", "Device: cpu, cuda, cuda:N or auto.");
ABSL_FLAG(int, num_threads, 0, "CPU device threads; 0 = all cores.");
ABSL_FLAG(int64_t, step_deadline_ms, 60000,
          "Default step deadline: a step still incomplete this long after it began is aborted.");
ABSL_FLAG(int, max_sessions, 64, "Most sessions held at once.");
ABSL_FLAG(int64_t, max_params_per_session, 1 << 20, "Most parameters in one session.");
ABSL_FLAG(int64_t, max_session_bytes, 0,
          "Most bytes of masters, gradients and optimizer state per session; 0 = no limit.");
ABSL_FLAG(int64_t, shutdown_grace_ms, 10000, "Time running calls get to finish on SIGTERM.");

namespace optstep {
namespace {

int Run() {
  // Signals are taken by a dedicated thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EngineOptions engine_options;
  engine_options.device.kind = absl::GetFlag(FLAGS_device);
  engine_options.device.num_threads = absl::GetFlag(FLAGS_num_threads);
  engine_options.default_step_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_step_deadline_ms));
  engine_options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  engine_options.max_params_per_session = absl::GetFlag(FLAGS_max_params_per_session);
  engine_options.max_session_bytes = absl::GetFlag(FLAGS_max_session_bytes);
  auto engine = Engine::Create(engine_options);
  if (!engine.ok()) {
    LOG(ERROR) << "cannot start the engine: " << engine.status();
    return 1;
  }

  ServerOptions server_options;
  server_options.host = absl::GetFlag(FLAGS_host);
  server_options.port = absl::GetFlag(FLAGS_port);
  auto server = Server::Start(server_options, engine->get());
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    return 1;
  }
  std::cout << "listening on " << server_options.host << ":" << (*server)->port() << " (device "
            << (*engine)->device().name() << ")" << std::endl;

  std::thread signal_thread([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    LOG(INFO) << "signal " << signal << ": shutting down";
    (*server)->Shutdown(absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  });
  (*server)->Wait();
  signal_thread.join();
  server->reset();
  engine->reset();
  LOG(INFO) << "stopped";
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("optstep_server --port=PORT [--device=cpu]: an optimizer-server rank");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return optstep::Run();
}
