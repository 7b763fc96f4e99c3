#ifndef OPTSTEP_CLIENT_CLI_REMOTE_CHECKPOINT_COMMANDS_H_
#define OPTSTEP_CLIENT_CLI_REMOTE_CHECKPOINT_COMMANDS_H_

// `optstep save|load --session=ID --name=N`: a checkpoint of a running session, written or
// restored by the servers under their --checkpoint_root (docs/checkpoints.md). Progress goes to
// `out`: a bar redrawn in place when `terminal`, else one plain line per report.

#include <ostream>
#include <string>

#include "client/cpp/client_options.h"

namespace optstep {
namespace cli {

struct RemoteCheckpointCommand {
  std::string command;  // "save" or "load"
  std::string session;
  std::string name;
  bool terminal = false;
};

// Exit statuses as RunCommand's (commands.h).
int RunRemoteCheckpointCommand(const RemoteCheckpointCommand& command, const ClientOptions& options,
                               std::ostream& out, std::ostream& err);

}  // namespace cli
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CLI_REMOTE_CHECKPOINT_COMMANDS_H_
