#ifndef OPTSTEP_CLIENT_CLI_OFFLINE_CHECKPOINT_COMMANDS_H_
#define OPTSTEP_CLIENT_CLI_OFFLINE_CHECKPOINT_COMMANDS_H_

// `optstep ckpt ...`: offline tools over checkpoint directories (docs/checkpoints.md). They
// read and write files only; no server is involved.
//
//   ckpt inspect <dir>               manifest summary and one line per shard
//   ckpt verify <dir>                every shard's CRC-32C; exit 0 or 2 with the error
//   ckpt merge <src> <dst>           one shard
//   ckpt split <src> <dst> --ranks N N shards, parameters placed by PartitionByCost
//
// <dst> is a new directory "<root>/<name>" (written as a temporary directory, then renamed).

#include <ostream>
#include <string>

#include "absl/types/span.h"
#include "checkpoint/checkpoint_reader.h"

namespace optstep {
namespace cli {

// Filled from flags by main.cc.
struct OfflineCheckpointOptions {
  int ranks = 0;  // split: number of shards of the new checkpoint
};

// `args`: the positional arguments after the program name, starting with "ckpt". Returns the
// exit status (kExitOk, kExitCallFailed when the checkpoint is refused, kExitUsage).
int RunOfflineCheckpointCommand(absl::Span<const std::string> args,
                                const OfflineCheckpointOptions& options, std::ostream& out,
                                std::ostream& err);

// What `ckpt inspect` prints for an opened checkpoint: a summary block (directory, format,
// definition digest, world size, step, parameters, tensors, bytes) and a table per shard
// (RANK FILE PARAMS TENSORS BYTES CRC32C).
std::string FormatCheckpointSummary(const CheckpointReader& reader);

}  // namespace cli
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CLI_OFFLINE_CHECKPOINT_COMMANDS_H_
