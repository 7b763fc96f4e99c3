#include "tests/testing/server_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstep {
namespace testutil {

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace ? workspace : "optstep", "/", workspace_relative);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(std::vector<std::string> args) {
  const std::string binary = RunfilePath("server/optstep_server");
  args.insert(args.begin(), {binary, "--port=0", "--host=127.0.0.1"});
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    std::perror("execv");
    _exit(127);
  }
  close(out[1]);
  std::unique_ptr<ServerProcess> process(new ServerProcess());
  process->pid_ = pid;
  // Read the first stdout line: "listening on 127.0.0.1:PORT (device cpu)".
  std::string line;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  char c;
  while (absl::Now() < deadline) {
    const ssize_t n = read(out[0], &c, 1);
    if (n <= 0) break;
    if (c == '\n') break;
    line.push_back(c);
  }
  close(out[0]);
  const std::string prefix = "listening on ";
  if (line.rfind(prefix, 0) != 0) {
    return absl::UnavailableError(absl::StrCat("server did not start; first line: '", line, "'"));
  }
  const std::string rest = line.substr(prefix.size());
  process->address_ = rest.substr(0, rest.find(' '));
  const std::string metrics = "metrics port ";
  const size_t at = rest.find(metrics);
  if (at != std::string::npos)
    process->metrics_port_ = std::atoi(rest.c_str() + at + metrics.size());
  return process;
}

absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartGroup(
    int world_size, const std::vector<std::string>& args) {
  return StartGroupWith(world_size, [&args](int) { return args; });
}

absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> StartGroupWith(
    int world_size, const std::function<std::vector<std::string>(int rank)>& args_of) {
  std::vector<std::unique_ptr<ServerProcess>> group;
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> rank_args = args_of(rank);
    rank_args.push_back(absl::StrCat("--rank=", rank));
    rank_args.push_back(absl::StrCat("--world_size=", world_size));
    if (rank > 0) rank_args.push_back(absl::StrCat("--rendezvous=", group[0]->address()));
    auto process = ServerProcess::Start(rank_args);
    if (!process.ok()) return process.status();
    group.push_back(*std::move(process));
  }
  return group;
}

int ServerProcess::SignalAndWait(int signal) {
  Signal(signal);
  return Wait();
}

void ServerProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

int ServerProcess::Wait() {
  int status = 0;
  if (pid_ <= 0) return -1;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

int ServerProcess::WaitFor(absl::Duration bound) {
  const absl::Time give_up = absl::Now() + bound;
  int status = 0;
  while (pid_ > 0) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    if (absl::Now() >= give_up) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return -1;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) SignalAndWait(SIGKILL);
}

}  // namespace testutil
}  // namespace optstep
