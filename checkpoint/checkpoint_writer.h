#ifndef OPTSTEP_CHECKPOINT_CHECKPOINT_WRITER_H_
#define OPTSTEP_CHECKPOINT_CHECKPOINT_WRITER_H_

// Writing a checkpoint directory `<root>/<name>/` (docs/checkpoints.md) from several ranks that
// share a file system, coordinated by the caller:
//
//   rank 0:     PrepareCheckpoint(root, name, save)     creates <root>/.<name>.<save>.tmp/
//   every rank: WriteCheckpointShard(root, name, save, r, w, tensors, progress) -> ShardFile
//   rank 0:     CommitCheckpoint(root, name, save, manifest with every rank's ShardFile, ...)
//
// `save` identifies one save (NewCheckpointSave; the caller passes the same to every rank), so
// that two saves of one name at once (two sessions, two groups sharing the root) each write their
// own temporary and neither touches the other's: the first to commit takes the name, the other
// gets ALREADY_EXISTS. Crash safety: everything is written under the hidden temporary directory
// and fsynced; Commit
// writes manifest.json last and renames the directory into place, so a directory without the
// leading dot always holds a complete checkpoint. Pruning renames a victim back to a hidden
// name before deleting it. A failure cleans up after itself: a shard that could not be written
// is removed by its rank, and a failed Prepare or Commit removes the temporary directory; when
// another rank's part failed, rank 0 calls AbandonCheckpoint (temporaries.h). Functions are
// thread-compatible; different ranks may write their shards concurrently.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/manifest.h"
#include "checkpoint/state_dict.h"
#include "kernels/tensor.h"

namespace optstep {

// Fills `n` bytes of a tensor's little-endian contents, starting at `byte_offset`, into `dst`.
using TensorByteReader = std::function<absl::Status(uint64_t byte_offset, size_t n, void* dst)>;

// One tensor to write. Exactly one of `data` (host memory, NumElements(shape) elements, alive
// until the write returns) and `read` is set.
struct TensorSource {
  std::string key;  // StateDict key, e.g. "state/adamw/layers.0.fc1.weight/exp_avg"
  StateTensor::Type type = StateTensor::Type::kF32;
  Shape shape;
  const void* data = nullptr;
  TensorByteReader read;
};

// Progress of a write, read or verification. Called after each staging buffer and each file.
struct CheckpointProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  int files_done = 0;
  int files_total = 0;
};
using CheckpointProgressCallback = std::function<void(const CheckpointProgress&)>;

struct CheckpointIoOptions {
  // Bytes of the bounded staging buffer through which reader callbacks are drained and files
  // are written or read. Host-pointer tensors larger than the buffer are written in place.
  size_t staging_bytes = 16u << 20;
};

// What a rank reports to rank 0 for the manifest.
struct ShardFile {
  std::string file;  // name inside the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The longest checkpoint name: its temporary's, ".<name>.<16 hex digits>.tmp", must fit in the
// 255 bytes of a file name.
inline constexpr size_t kMaxCheckpointNameBytes = 255 - 22;

// INVALID_ARGUMENT unless `name` is a single, non-hidden path component: not empty, not "." or
// "..", no '/', no control character (bytes 0x00-0x1f, 0x7f), no leading '.', at most
// kMaxCheckpointNameBytes. The message names the rule and the name, C-escaped.
absl::Status ValidateCheckpointName(absl::string_view name);

// A new identifier for one save (random, never 0): its temporary's name.
uint64_t NewCheckpointSave();

// "<root>/<name>" and "<root>/.<name>.<save as 16 hex digits>.tmp".
std::string CheckpointDir(absl::string_view root, absl::string_view name);

// Reads and parses <dir>/manifest.json: NOT_FOUND naming `dir` when there is none; parse errors
// as ParseManifest's, prefixed with the file's path.
absl::StatusOr<Manifest> ReadManifestFile(absl::string_view dir);
std::string CheckpointTempDir(absl::string_view root, absl::string_view name, uint64_t save);

// Rank 0, first: validates `name`, ALREADY_EXISTS if <root>/<name> exists, creates the temporary
// of `save` (ALREADY_EXISTS if it exists: the identifier is in use) and fsyncs `root` (which must
// exist: NOT_FOUND otherwise). The temporary directory is removed again when the fsync fails.
// The temporaries of other saves, of this name too, are not touched (a crashed save's go with
// SweepStaleCheckpointTemporaries).
absl::Status PrepareCheckpoint(absl::string_view root, absl::string_view name, uint64_t save);

// Every rank: writes shard-<rank>-of-<world>.safetensors into the temporary directory,
// streaming `tensors` in order through the staging buffer with the CRC-32C computed on the fly,
// and fsyncs it. `metadata` goes to the safetensors "__metadata__". INVALID_ARGUMENT for a bad
// rank/world, a duplicate or empty key, a source with neither or both of data/read, or a
// negative dimension; FAILED_PRECONDITION when the temporary directory is missing (Prepare not
// run); a reader callback's error is returned as is, annotated with the key. On any failure after
// the file was created, the partial file is removed.
absl::StatusOr<ShardFile> WriteCheckpointShard(absl::string_view root, absl::string_view name,
                                               uint64_t save, int rank, int world_size,
                                               absl::Span<const TensorSource> tensors,
                                               const CheckpointProgressCallback& progress = nullptr,
                                               const CheckpointIoOptions& options = {});

// Rank 0, last: checks `manifest` (one shard per rank; each file present with the recorded
// size: DATA_LOSS otherwise), writes manifest.json, fsyncs it and the directory, renames the
// temporary directory to <root>/<name> (ALREADY_EXISTS if taken meanwhile), fsyncs `root`
// (any failure up to here removes the temporary directory and everything in it), then
// keeps only the `keep_last` newest complete checkpoints of the same session (same definition
// digest, Manifest::session_id and session_owner; none when `manifest` names no session) in
// `root` (0 keeps all); other sessions' checkpoints are never pruned, nor ones that name none.
// Newest = latest manifest.json modification time, ties by name.
absl::Status CommitCheckpoint(absl::string_view root, absl::string_view name, uint64_t save,
                              const Manifest& manifest, int keep_last);

// Writes `contents` into `<dir>/<file>` atomically and durably: a hidden temporary beside it,
// fsynced, renamed into place, then `dir` fsynced, so that a reader sees the whole file or none,
// after a crash too (the session records beside automatic checkpoints).
absl::Status WriteFileAtomically(absl::string_view dir, absl::string_view file,
                                 absl::string_view contents);
// fsync of the directory `dir`, so that the renames and removals in it so far survive a crash.
absl::Status SyncDirectory(absl::string_view dir);
// The whole of the file `path`, at most `max_bytes`: NOT_FOUND when there is none, DATA_LOSS when
// it is longer, and a read that fails otherwise as its errno says (INTERNAL for EIO), naming it.
absl::StatusOr<std::string> ReadFileWhole(const std::string& path, uint64_t max_bytes);

// Names of the complete checkpoints in `root` (visible directories with a manifest.json),
// oldest first by the same order as pruning; one whose manifest cannot be looked at is left out.
absl::StatusOr<std::vector<std::string>> ListCheckpoints(absl::string_view root);
// Every visible entry of `root` with a checkpoint's name, complete or not, sorted, without
// looking into any: a reader that must tell a manifest's absence from a failed read reads each.
// The listing's own error (errno-typed, naming `root`) otherwise.
absl::StatusOr<std::vector<std::string>> ListCheckpointNames(absl::string_view root);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_CHECKPOINT_WRITER_H_
