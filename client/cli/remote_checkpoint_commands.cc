#include "client/cli/remote_checkpoint_commands.h"

#include <memory>

#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/format.h"
#include "client/cpp/client.h"

namespace optstep {
namespace cli {
namespace {

std::string ProgressLine(const v1::CheckpointProgress& p) {
  return absl::StrFormat("%d/%d bytes, %d/%d files, step %d", p.bytes_done(), p.bytes_total(),
                         p.files_done(), p.files_total(), p.step());
}

std::string ProgressBar(const v1::CheckpointProgress& p) {
  constexpr int kWidth = 30;
  const double fraction =
      p.bytes_total() == 0 ? 0.0 : static_cast<double>(p.bytes_done()) / p.bytes_total();
  const int filled = static_cast<int>(fraction * kWidth + 0.5);
  return absl::StrFormat("\r[%s%s] %3d%% %s", std::string(filled, '#'),
                         std::string(kWidth - filled, ' '), static_cast<int>(fraction * 100 + 0.5),
                         ProgressLine(p));
}

}  // namespace

int RunRemoteCheckpointCommand(const RemoteCheckpointCommand& command, const ClientOptions& options,
                               std::ostream& out, std::ostream& err) {
  if (command.session.empty() || command.name.empty()) {
    err << "optstep: " << command.command << " needs --session=<id> and --name=<checkpoint>\n\n"
        << kCommandUsage;
    return kExitUsage;
  }
  const std::string target = options.target;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) {
    err << FormatError(command.command, target, client.status());
    return kExitCallFailed;
  }
  auto report = [&](const v1::CheckpointProgress& p) {
    if (command.terminal) {
      out << ProgressBar(p) << std::flush;
    } else {
      out << command.command << ": " << ProgressLine(p) << "\n";
    }
  };
  absl::StatusOr<v1::CheckpointProgress> done =
      command.command == "save" ? (*client)->Save(command.session, command.name, report)
                                : (*client)->Load(command.session, command.name, report);
  if (command.terminal) out << "\n";
  if (!done.ok()) {
    err << FormatError(command.command, target, done.status());
    return kExitCallFailed;
  }
  out << (command.command == "save" ? "saved" : "loaded") << " checkpoint '" << command.name
      << "' of session " << command.session << " at step " << done->step() << "\n";
  return kExitOk;
}

}  // namespace cli
}  // namespace optstep
