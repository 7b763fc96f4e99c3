#ifndef OPTSTEP_CLIENT_CLI_COMMANDS_H_
#define OPTSTEP_CLIENT_CLI_COMMANDS_H_

// The subcommands of the `optstep` tool, after flag parsing: main.cc turns flags into
// ClientOptions and hands the positional arguments here. Output goes to `out`, diagnostics to
// `err`; the return value is the process exit status.

#include <ostream>
#include <string>

#include "absl/types/span.h"
#include "client/cpp/client_options.h"

namespace optstep {
namespace cli {

// Exit statuses.
inline constexpr int kExitOk = 0;           // success; health: SERVING
inline constexpr int kExitNotServing = 1;   // health: NOT_SERVING
inline constexpr int kExitCallFailed = 2;   // unreachable, deadline, not found, ...
inline constexpr int kExitUsage = 64;       // bad command line (as sysexits' EX_USAGE)

// The part of the usage text that lists commands and exit statuses.
extern const char kCommandUsage[];

// `args`: the positional arguments, without the program name, e.g. {"session", "show", "id"}.
int RunCommand(absl::Span<const std::string> args, const ClientOptions& options,
               std::ostream& out, std::ostream& err);

}  // namespace cli
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CLI_COMMANDS_H_
