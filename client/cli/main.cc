// optstep: the command line tool of the optstep service. Flags are defined here only; they
// become ClientOptions, and the commands live in commands.cc.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/cli/commands.h"
#include "client/cli/offline_checkpoint_commands.h"
#include "client/cli/remote_checkpoint_commands.h"
#include "client/cpp/client_options.h"

ABSL_FLAG(std::string, server, "localhost:50051", "host:port of the optstep server (rank 0)");
ABSL_FLAG(int32_t, timeout_ms, 3000,
          "deadline in milliseconds for connecting and for each call; keep it short for "
          "health probes");
ABSL_FLAG(int32_t, ranks, 0, "ckpt split: number of shards (ranks) of the new checkpoint");
ABSL_FLAG(std::string, session, "", "save / load: the session id");
ABSL_FLAG(std::string, name, "", "save / load: the checkpoint's name under the servers' root");
ABSL_FLAG(bool, tls, false, "use TLS (implied by --tls_ca and --tls_cert)");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that signed the server's certificate");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate, for servers that require one");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name to check the server's certificate against instead of the --server host");
ABSL_FLAG(std::string, token, "",
          "bearer token (needs TLS); default: the OPTSTEP_TOKEN environment variable");

namespace {

// Abseil 20220623 answers --help with exit status 1 and lists only flags of files it guesses
// belong to the program; the tool prints its own help (from the flags' own help text) instead.
bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

void PrintHelp(std::ostream& out) {
  out << optstep::cli::kCommandUsage << "\nflags:\n";
  for (const char* name : {"server", "timeout_ms", "ranks", "session", "name", "tls", "tls_ca",
                           "tls_cert", "tls_key", "tls_server_name", "token"}) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    out << "  --" << name << "  " << flag->Help() << " (default: " << flag->DefaultValue()
        << ")\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(optstep::cli::kCommandUsage);
  if (WantsHelp(argc, argv)) {
    PrintHelp(std::cout);
    return optstep::cli::kExitOk;
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);

  if (positional.size() > 1 && absl::string_view(positional[1]) == "ckpt") {  // offline
    optstep::cli::OfflineCheckpointOptions ckpt;
    ckpt.ranks = absl::GetFlag(FLAGS_ranks);
    const std::vector<std::string> args(positional.begin() + 1, positional.end());
    return optstep::cli::RunOfflineCheckpointCommand(args, ckpt, std::cout, std::cerr);
  }
  const int32_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) {
    std::cerr << "optstep: --timeout_ms must be positive, not " << timeout_ms << "\n";
    return optstep::cli::kExitUsage;
  }
  optstep::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.connect_timeout = absl::Milliseconds(timeout_ms);
  options.rpc_timeout = absl::Milliseconds(timeout_ms);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.tls = absl::GetFlag(FLAGS_tls) || !options.tls_ca_file.empty() ||
                !options.tls_cert_file.empty();
  // The environment keeps the token out of the process list and shell history.
  options.token = absl::GetFlag(FLAGS_token);
  const char* env_token = std::getenv("OPTSTEP_TOKEN");
  if (options.token.empty() && env_token != nullptr) options.token = env_token;

  const std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.size() == 1 && (args[0] == "save" || args[0] == "load")) {
    optstep::cli::RemoteCheckpointCommand command;
    command.command = args[0];
    command.session = absl::GetFlag(FLAGS_session);
    command.name = absl::GetFlag(FLAGS_name);
    command.terminal = isatty(STDOUT_FILENO) != 0;
    return optstep::cli::RunRemoteCheckpointCommand(command, options, std::cout, std::cerr);
  }
  return optstep::cli::RunCommand(args, options, std::cout, std::cerr);
}
