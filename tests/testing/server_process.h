#ifndef OPTSTEP_TESTS_TESTING_SERVER_PROCESS_H_
#define OPTSTEP_TESTS_TESTING_SERVER_PROCESS_H_

// Runs the real optstep_server binary as a child process on a free port (--port=0), for
// integration tests. The binary is found in the test's runfiles.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace optstep {
namespace testutil {

class ServerProcess {
 public:
  // Starts the server with `args` (besides --port=0 --host=127.0.0.1) and waits for its
  // "listening on" line. UNAVAILABLE when it exits or stays silent for 30 s.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(std::vector<std::string> args = {});
  // SIGKILLs the process if it still runs.
  ~ServerProcess();

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // Sends `signal` and waits for the exit; answers the exit status as waitpid reports it.
  int SignalAndWait(int signal);
  // Sends `signal` and returns at once.
  void Signal(int signal);
  // Waits for the exit; answers the exit status as waitpid reports it.
  int Wait();
  // Waits up to `bound` for the exit; answers its status as waitpid reports it, or -1 while the
  // process still runs.
  int WaitFor(absl::Duration bound);
  // The port of /metrics that the server printed ("metrics port N"); 0 when it serves none.
  int metrics_port() const { return metrics_port_; }

 private:
  ServerProcess() = default;

  pid_t pid_ = -1;
  std::string address_;
  int metrics_port_ = 0;
};

// Starts a group of `world_size` ranks (rank 0 first, the others with --rendezvous pointing at
// it), each with `args`. The processes are in rank order.
absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartGroup(
    int world_size, const std::vector<std::string>& args = {});
// The same, rank r with `args_of(r)`.
absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartGroupWith(
    int world_size, const std::function<std::vector<std::string>(int rank)>& args_of);

// Path of a binary of this workspace in the test's runfiles, e.g. "server/optstep_server".
std::string RunfilePath(const std::string& workspace_relative);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_SERVER_PROCESS_H_
