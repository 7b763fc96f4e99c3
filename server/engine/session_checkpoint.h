#ifndef OPTSTEP_SERVER_ENGINE_SESSION_CHECKPOINT_H_
#define OPTSTEP_SERVER_ENGINE_SESSION_CHECKPOINT_H_

// A session's part in saving and loading checkpoint directories (docs/checkpoints.md). The
// caller (server/rpc) holds the session at one resolution on every rank (SessionHolds::Hold /
// Settle) and runs the parts in this order:
//
//   Save: rank 0 PrepareCheckpoint -> every rank WriteHeldShard -> rank 0 CommitSessionCheckpoint
//         (the hold's token is the save's identifier: its temporary directory's name)
//   Load: every rank StageCheckpoint -> when all succeeded, every rank SessionHolds::ApplyStaged
//
// Shard r holds the masters and optimizer state of the parameters rank r owns, and the counters
// (every shard). A load reads by exact key whatever the checkpoint's world size was: the masters
// this rank holds (every one under REPLICATED storage, those it owns now under OWNERS) and the
// state of the parameters this rank owns now.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_writer.h"
#include "server/engine/session.h"

namespace optstep {

struct CheckpointLocation {
  std::string root;  // the rank's --checkpoint_root (a shared file system)
  std::string name;  // one directory under it (ValidateCheckpointName)
};

// Automatic checkpoints (docs/checkpoints.md, "Automatic checkpoints") live in a directory of
// their own per session, `<checkpoint root>/auto/<session id>/step-<N>`, and are named on the
// wire (between the ranks, and to Load) "auto/<session id>/step-<N>". A user's Save may not take
// the name "auto".
inline constexpr char kAutoCheckpointDir[] = "auto";
// "auto/<session_id>/step-<step>".
std::string AutoCheckpointName(const std::string& session_id, uint64_t step);
// The step of an automatic checkpoint's directory named "step-<N>"; nullopt for another name.
std::optional<uint64_t> AutoCheckpointStep(absl::string_view dir_name);
// "<root>/auto/<session_id>": the root of that session's automatic checkpoints.
std::string AutoCheckpointRoot(const std::string& root, const std::string& session_id);
// Where checkpoint `name` lives under `root`: a plain name (ValidateCheckpointName) directly
// under it; with `allow_auto`, also an automatic one "auto/<session id>/<name>" (each part a
// valid name) under AutoCheckpointRoot. INVALID_ARGUMENT naming the rule otherwise, and for the
// reserved plain name "auto".
absl::StatusOr<CheckpointLocation> LocateCheckpoint(const std::string& root,
                                                    const std::string& name, bool allow_auto);
// Whether `name` has the form of an automatic checkpoint's wire name.
bool IsAutoCheckpointName(const std::string& name);

// Writes this rank's shard of the held state; `progress` is called as it goes (callers also
// renew the hold's lease there).
absl::StatusOr<ShardFile> WriteHeldShard(Session& session, uint64_t token,
                                         const CheckpointLocation& where,
                                         const CheckpointProgressCallback& progress);

// As WriteHeldShard, from a snapshot: this rank's shard of the held state is copied to host
// memory (the hold renewed for `lease` as it goes), `release` is called (it ends this rank's
// part of the hold, so that its steps go on), and only then is the shard written. The shard's
// contents are those WriteHeldShard writes.
absl::StatusOr<ShardFile> WriteSnapshotShard(Session& session, uint64_t token,
                                             const CheckpointLocation& where, absl::Duration lease,
                                             const std::function<void()>& release);

// Rank 0: the manifest of the held state (definition: opaque JSON text of the session's
// definition; layout, costs, groups, counters) with every rank's shard, then the commit.
absl::Status CommitSessionCheckpoint(Session& session, uint64_t token, const HeldPoint& point,
                                     const CheckpointLocation& where,
                                     const std::string& definition_json,
                                     const std::vector<ShardFile>& shards, int keep_last);

// Opens and checks the checkpoint before anything changes: format version (FAILED_PRECONDITION),
// definition digest against `definition_json` (FAILED_PRECONDITION naming both digests), sizes
// and headers (DATA_LOSS), every tensor this rank needs against the headers (DATA_LOSS naming a
// missing key or a mismatched shape); then reads every shard once, front to back, checking its
// checksum and step counters as it goes (DATA_LOSS naming the file; nothing is staged then), and
// stages the tensors in the session. `progress` counts the bytes of all the shards. Answers the
// checkpoint's step.
absl::StatusOr<uint64_t> StageCheckpoint(Session& session, uint64_t token,
                                         const CheckpointLocation& where,
                                         const std::string& definition_json,
                                         const CheckpointProgressCallback& progress);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_SESSION_CHECKPOINT_H_
