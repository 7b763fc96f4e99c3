#include "client/cli/commands.h"

#include <memory>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/cli/format.h"
#include "client/cpp/client.h"

namespace optstep {
namespace cli {

const char kCommandUsage[] =
    "usage: optstep <command> [--server=host:port] [--timeout_ms=N]\n"
    "\n"
    "commands:\n"
    "  health [service]           print SERVING or NOT_SERVING (grpc.health.v1) of the server,\n"
    "                             or of one service (optstep.liveness: the process alone)\n"
    "  session list               list the sessions: id, name, params, trainers, mode, step,\n"
    "                             skipped steps, bytes (fp32 masters + optimizer state)\n"
    "  session show <session_id>  one session: parameters (shape, owner, group), groups\n"
    "                             (sub-optimizer, lr, weight decay, wd_mult) and layout\n"
    "  save --session=ID --name=N save the session as checkpoint N under the servers'\n"
    "                             --checkpoint_root (one step on every rank); progress shown\n"
    "  load --session=ID --name=N restore checkpoint N onto the session's current ranks\n"
    "  shutdown                   shut the server (every rank given by --server or --ranks)\n"
    "                             down as SIGTERM does (admin token)\n"
    "  ckpt inspect <dir>         checkpoint summary (offline): definition digest, world size,\n"
    "                             step, parameters, tensors and bytes per shard\n"
    "  ckpt verify <dir>          check every shard's CRC-32C against the manifest\n"
    "  ckpt merge <src> <dst>     write <dst>, the checkpoint <src> as one shard\n"
    "  ckpt split <src> <dst> --ranks=N\n"
    "                             write <dst>, the checkpoint <src> as N shards (parameters\n"
    "                             placed by estimated cost, as the server partitions them)\n"
    "\n"
    "exit status: 0 success (health: SERVING), 1 NOT_SERVING, 2 the call failed\n"
    "(unreachable, deadline exceeded, unknown session, ...), 64 bad command line.\n";

namespace {

std::string Target(const ClientOptions& options) {
  return options.rank_targets.empty() ? options.target : absl::StrJoin(options.rank_targets, ",");
}

int Usage(std::ostream& err, const std::string& problem) {
  err << "optstep: " << problem << "\n\n" << kCommandUsage;
  return kExitUsage;
}

int Health(Client& client, const std::string& service, std::ostream& out, std::ostream& err,
           const std::string& target) {
  absl::StatusOr<bool> serving = client.CheckHealth(service);
  if (!serving.ok()) {
    err << FormatError("health", target, serving.status());
    return kExitCallFailed;
  }
  out << FormatHealth(*serving) << "\n";
  return *serving ? kExitOk : kExitNotServing;
}

int SessionList(Client& client, std::ostream& out, std::ostream& err, const std::string& target) {
  absl::StatusOr<std::vector<v1::SessionSummary>> sessions = client.ListSessions();
  if (!sessions.ok()) {
    err << FormatError("session list", target, sessions.status());
    return kExitCallFailed;
  }
  out << FormatSessionList(*sessions);
  return kExitOk;
}

int SessionShow(Client& client, const std::string& id, std::ostream& out, std::ostream& err,
                const std::string& target) {
  absl::StatusOr<v1::SessionInfo> session = client.GetSession(id);
  if (!session.ok()) {
    err << FormatError("session show", target, session.status());
    return kExitCallFailed;
  }
  out << FormatSessionDetails(*session);
  return kExitOk;
}

int Shutdown(Client& client, std::ostream& out, std::ostream& err, const std::string& target) {
  for (int rank = 0; rank < client.num_ranks(); ++rank) {
    absl::Status status = client.Shutdown(rank, "optstep shutdown");
    if (!status.ok()) {
      err << FormatError("shutdown", target, status);
      return kExitCallFailed;
    }
  }
  out << "shutting down " << target << "\n";
  return kExitOk;
}

}  // namespace

int RunCommand(absl::Span<const std::string> args, const ClientOptions& options, std::ostream& out,
               std::ostream& err) {
  if (args.empty()) return Usage(err, "no command");
  const std::string& command = args[0];
  std::string subcommand;
  if (command == "health") {
    if (args.size() > 2) return Usage(err, "health takes at most one service name");
  } else if (command == "shutdown") {
    if (args.size() != 1) return Usage(err, "shutdown takes no arguments");
  } else if (command == "session") {
    if (args.size() < 2) return Usage(err, "session needs a subcommand: list or show");
    subcommand = args[1];
    if (subcommand == "list") {
      if (args.size() != 2) return Usage(err, "session list takes no arguments");
    } else if (subcommand == "show") {
      if (args.size() != 3) return Usage(err, "session show takes one session id");
    } else {
      return Usage(err, "unknown session subcommand '" + subcommand + "'");
    }
  } else {
    return Usage(err, "unknown command '" + command + "'");
  }

  const std::string target = Target(options);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    err << FormatError(subcommand.empty() ? command : command + " " + subcommand, target,
                       client.status());
    return kExitCallFailed;
  }
  if (command == "health")
    return Health(**client, args.size() == 2 ? args[1] : "", out, err, target);
  if (command == "shutdown") return Shutdown(**client, out, err, target);
  if (subcommand == "list") return SessionList(**client, out, err, target);
  return SessionShow(**client, args[2], out, err, target);
}

}  // namespace cli
}  // namespace optstep
