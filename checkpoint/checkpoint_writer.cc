#include "checkpoint/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/temporaries.h"
#include "glog/logging.h"

namespace optstep {
namespace {

using internal::File;

// Writes a file through two staging buffers, computing its CRC-32C on the way. One write is in
// flight on a helper thread while the caller checksums and fills the next piece, so that the
// checksum and the reader callbacks overlap with the storage. Memory: 2 x capacity.
class StagedFileWriter {
 public:
  StagedFileWriter(File file, std::string path, size_t capacity, uint64_t total,
                   const CheckpointProgressCallback& progress)
      : file_(std::move(file)),
        path_(std::move(path)),
        capacity_(std::max<size_t>(capacity, 4096)),
        buffers_{std::make_unique<char[]>(capacity_), std::make_unique<char[]>(capacity_)},
        progress_(progress) {
    report_.bytes_total = total;
    report_.files_total = 1;
  }
  ~StagedFileWriter() { (void)WaitForWrite(); }  // the buffers outlive the write in flight

  absl::Status Append(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    if (n >= capacity_) {  // large host tensors go straight from their memory
      OPTSTEP_RETURN_IF_ERROR(Flush());
      while (n > 0) {
        const size_t piece = std::min(n, capacity_);
        OPTSTEP_RETURN_IF_ERROR(Emit(p, piece));
        p += piece;
        n -= piece;
      }
      return absl::OkStatus();
    }
    while (n > 0) {
      const size_t piece = std::min(n, capacity_ - used_);
      std::memcpy(buffer() + used_, p, piece);
      used_ += piece;
      p += piece;
      n -= piece;
      if (used_ == capacity_) OPTSTEP_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }

  // Drains `bytes` bytes from `read` into the staging buffer.
  absl::Status AppendFrom(const TensorByteReader& read, uint64_t bytes, const std::string& key) {
    uint64_t offset = 0;
    while (offset < bytes) {
      if (used_ == capacity_) OPTSTEP_RETURN_IF_ERROR(Flush());
      const size_t piece =
          static_cast<size_t>(std::min<uint64_t>(bytes - offset, capacity_ - used_));
      absl::Status status = read(offset, piece, buffer() + used_);
      if (!status.ok()) {
        return absl::Status(status.code(),
                            absl::StrCat("reading tensor '", key, "' bytes [", offset, ", ",
                                         offset + piece, "): ", status.message()));
      }
      used_ += piece;
      offset += piece;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ShardFile> Finish(std::string file_name) {
    OPTSTEP_RETURN_IF_ERROR(Flush());
    OPTSTEP_RETURN_IF_ERROR(WaitForWrite());
    OPTSTEP_RETURN_IF_ERROR(internal::Fsync(file_.fd(), path_));
    report_.files_done = 1;
    if (progress_) progress_(report_);
    return ShardFile{std::move(file_name), report_.bytes_done, crc_};
  }

 private:
  char* buffer() { return buffers_[current_].get(); }

  // Hands the filled buffer to the writer and switches to the other one, which is free: at
  // most one write is in flight and Emit waited for it.
  absl::Status Flush() {
    if (used_ == 0) return absl::OkStatus();
    const size_t n = used_;
    used_ = 0;
    OPTSTEP_RETURN_IF_ERROR(Emit(buffer(), n));
    current_ ^= 1;
    return absl::OkStatus();
  }

  absl::Status Emit(const char* p, size_t n) {
    crc_ = Crc32cExtend(crc_, p, n);
    OPTSTEP_RETURN_IF_ERROR(WaitForWrite());
    in_flight_bytes_ = n;
    in_flight_ = std::async(std::launch::async, [fd = file_.fd(), p, n, this] {
      return internal::WriteAll(fd, p, n, path_);
    });
    return absl::OkStatus();
  }

  absl::Status WaitForWrite() {
    if (!in_flight_.valid()) return absl::OkStatus();
    absl::Status status = in_flight_.get();
    if (!status.ok()) return status;
    report_.bytes_done += in_flight_bytes_;
    if (progress_) progress_(report_);
    return absl::OkStatus();
  }

  File file_;
  std::string path_;
  size_t capacity_;
  std::unique_ptr<char[]> buffers_[2];
  int current_ = 0;   // the buffer being filled
  size_t used_ = 0;   // bytes of it filled
  uint32_t crc_ = 0;  // of everything handed to Emit
  std::future<absl::Status> in_flight_;
  size_t in_flight_bytes_ = 0;
  CheckpointProgress report_;
  const CheckpointProgressCallback& progress_;
};

absl::Status CheckDirName(absl::string_view root, absl::string_view name) {
  OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(name));
  if (root.empty()) return absl::InvalidArgumentError("checkpoint root is empty");
  return absl::OkStatus();
}

// Renames without replacing an existing target (renameat2 RENAME_NOREPLACE where the file
// system supports it; else an existence check just before, enough for a single committer).
absl::Status RenameNoReplace(const std::string& from, const std::string& to) {
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) return internal::ErrnoStatus(errno, "rename to", to);
#endif
  if (internal::Exists(to)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint '", to, "' exists already"));
  }
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return internal::ErrnoStatus(errno, "rename to", to);
  }
  return absl::OkStatus();
}

struct Complete {
  int64_t mtime_ns;
  std::string name;
  bool operator<(const Complete& other) const {
    return std::tie(mtime_ns, name) < std::tie(other.mtime_ns, other.name);
  }
};

absl::StatusOr<std::vector<Complete>> CompleteCheckpoints(const std::string& root) {
  // Hidden names (temporaries, checkpoints being removed) are not listed.
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListCheckpointNames(root));
  std::vector<Complete> found;
  for (const std::string& name : names) {
    struct stat st;
    const std::string manifest = absl::StrCat(root, "/", name, "/", kManifestFile);
    if (::stat(manifest.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    found.push_back({int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec, name});
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The definition digest recorded in a complete checkpoint's manifest; empty when the manifest
// cannot be read or parsed.
// Whether checkpoint `name` under `root` was saved by the session of `manifest` (same definition,
// session and owner). A manifest that cannot be read, or that records no session, is not.
bool SavedBySameSession(absl::string_view root, const std::string& name, const Manifest& manifest,
                        const std::string& digest) {
  absl::StatusOr<Manifest> other = ReadManifestFile(CheckpointDir(root, name));
  return other.ok() && other->definition_digest == digest && !other->session_id.empty() &&
         other->session_id == manifest.session_id && other->session_owner == manifest.session_owner;
}

// Hides the checkpoint first (a rename), so that a crash halfway never leaves a visible
// directory with some files gone.
absl::Status RemoveCheckpoint(absl::string_view root, const std::string& name, uint64_t save) {
  const std::string hidden = CheckpointTempDir(root, name, save);
  OPTSTEP_RETURN_IF_ERROR(internal::RemoveTree(hidden));
  const std::string dir = CheckpointDir(root, name);
  if (::rename(dir.c_str(), hidden.c_str()) != 0) {
    return internal::ErrnoStatus(errno, "rename for removal", dir);
  }
  OPTSTEP_RETURN_IF_ERROR(internal::FsyncPath(std::string(root)));
  return internal::RemoveTree(hidden);
}

// Everything of a commit up to the checkpoint's rename into place and the fsync of the root.
absl::Status PublishCheckpoint(absl::string_view root, absl::string_view name, uint64_t save,
                               const Manifest& manifest, const std::string& text) {
  const std::string tmp = CheckpointTempDir(root, name, save);
  for (const ManifestShard& shard : manifest.shards) {
    const std::string path = absl::StrCat(tmp, "/", shard.file);
    absl::StatusOr<uint64_t> size = internal::FileSize(path);
    if (!size.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint '", name, "': shard '", shard.file,
                                              "' was not written: ", size.status().message()));
    }
    if (*size != shard.bytes) {
      return absl::DataLossError(absl::StrCat("checkpoint '", name, "': shard '", shard.file,
                                              "' has ", *size, " bytes, the manifest says ",
                                              shard.bytes));
    }
  }
  OPTSTEP_RETURN_IF_ERROR(internal::WriteSmallFile(absl::StrCat(tmp, "/", kManifestFile), text));
  OPTSTEP_RETURN_IF_ERROR(internal::FsyncPath(tmp));
  absl::Status renamed = RenameNoReplace(tmp, CheckpointDir(root, name));
  if (renamed.code() == absl::StatusCode::kAlreadyExists) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint '", name, "' exists already in '", root, "'"));
  }
  OPTSTEP_RETURN_IF_ERROR(renamed);
  return internal::FsyncPath(std::string(root));
}

// Keeps the `keep_last` newest complete checkpoints saved by `manifest`'s session (its definition,
// session id and owner), `name` (just committed) always among them. A failure to prune is logged,
// not fatal to the save.
absl::Status PruneCheckpoints(absl::string_view root, absl::string_view name, uint64_t save,
                              const Manifest& manifest, int keep_last) {
  absl::StatusOr<std::vector<Complete>> all = CompleteCheckpoints(std::string(root));
  if (!all.ok()) {
    LOG(WARNING) << "checkpoint '" << name << "' committed; pruning failed: " << all.status();
    return absl::OkStatus();
  }
  // Only the checkpoints of the same session count: another session's are not ours to prune,
  // though it may have the same definition (another tenant training the same model). A manifest
  // that cannot be read, or that does not say which session saved it, is left alone.
  absl::StatusOr<std::string> digest = DefinitionDigest(manifest.definition);
  if (!digest.ok()) return digest.status();
  if (manifest.session_id.empty()) return absl::OkStatus();
  std::vector<Complete> same;
  for (Complete& c : *all) {
    if (c.name == name || SavedBySameSession(root, c.name, manifest, *digest)) {
      same.push_back(std::move(c));
    }
  }
  int excess = static_cast<int>(same.size()) - keep_last;
  for (const Complete& victim : same) {
    if (excess <= 0) break;
    if (victim.name == name) continue;
    absl::Status removed = RemoveCheckpoint(root, victim.name, save);
    if (!removed.ok()) LOG(WARNING) << "pruning checkpoint '" << victim.name << "': " << removed;
    --excess;
  }
  return absl::OkStatus();
}

// `status`; when it is an error, the temporary directory of the save is removed first (the save
// failed: its files must not fill the disk).
absl::Status RemoveTemporaryOnError(absl::string_view root, absl::string_view name, uint64_t save,
                                    absl::Status status) {
  if (status.ok()) return status;
  absl::Status removed = AbandonCheckpoint(root, name, save);
  if (!removed.ok()) LOG(WARNING) << "removing the temporary of a failed save: " << removed;
  return status;
}

// Writes the header and the tensors into `file` (at `path`), fsyncs it, and describes it.
absl::StatusOr<ShardFile> WriteShardFile(File file, const std::string& path,
                                         const std::string& file_name, const std::string& header,
                                         const std::vector<SafetensorsEntry>& entries,
                                         absl::Span<const TensorSource> tensors,
                                         const CheckpointProgressCallback& progress,
                                         const CheckpointIoOptions& options) {
  const uint64_t total = header.size() + (entries.empty() ? 0 : entries.back().end);
  StagedFileWriter writer(std::move(file), path, options.staging_bytes, total, progress);
  OPTSTEP_RETURN_IF_ERROR(writer.Append(header.data(), header.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = entries[i].end - entries[i].begin;
    if (tensors[i].data != nullptr) {
      OPTSTEP_RETURN_IF_ERROR(writer.Append(tensors[i].data, bytes));
    } else {
      OPTSTEP_RETURN_IF_ERROR(writer.AppendFrom(tensors[i].read, bytes, tensors[i].key));
    }
  }
  return writer.Finish(file_name);
}

}  // namespace

absl::StatusOr<Manifest> ReadManifestFile(absl::string_view dir) {
  // manifest.json holds one entry per parameter: generous for billions of parameters' names.
  constexpr uint64_t kMaxManifestBytes = 1u << 30;
  const std::string path = absl::StrCat(dir, "/", kManifestFile);
  absl::StatusOr<std::string> text = internal::ReadSmallFile(path, kMaxManifestBytes);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint at '", dir, "': ", text.status().message()));
    }
    return text.status();
  }
  absl::StatusOr<Manifest> manifest = ParseManifest(*text);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat("'", path, "': ", manifest.status().message()));
  }
  return manifest;
}

absl::Status ValidateCheckpointName(absl::string_view name) {
  // The name as C escapes: a control character must not reach a message or a log line raw.
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint name '", CallerText(name, kMaxCheckpointNameBytes), "' ", why));
  };
  if (name.empty()) return bad("is empty");
  OPTSTEP_RETURN_IF_ERROR(CheckCallerName("checkpoint name", name, kMaxCheckpointNameBytes));
  if (name[0] == '.') return bad("starts with '.' (hidden names, '.' and '..' are reserved)");
  if (absl::StrContains(name, '/')) return bad("contains '/'; it must be one path component");
  return absl::OkStatus();
}

std::string CheckpointDir(absl::string_view root, absl::string_view name) {
  return absl::StrCat(root, "/", name);
}

uint64_t NewCheckpointSave() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base = (uint64_t{std::random_device()()} << 32) ^ std::random_device()();
  // Distinct within the process (the counter), and between processes sharing a root (the base).
  const uint64_t save = base + (++counter) * 0x9E3779B97F4A7C15ull;
  return save == 0 ? 1 : save;
}

std::string CheckpointTempDir(absl::string_view root, absl::string_view name, uint64_t save) {
  return absl::StrCat(root, "/.", name, ".", absl::Hex(save, absl::kZeroPad16), ".tmp");
}

absl::Status PrepareCheckpoint(absl::string_view root, absl::string_view name, uint64_t save) {
  OPTSTEP_RETURN_IF_ERROR(CheckDirName(root, name));
  const std::string root_dir(root);
  struct stat st;
  if (::stat(root_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint root '", root, "' is not an existing directory"));
  }
  if (internal::Exists(CheckpointDir(root, name))) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint '", name, "' exists already in '", root, "'"));
  }
  const std::string tmp = CheckpointTempDir(root, name, save);
  if (::mkdir(tmp.c_str(), 0755) != 0) return internal::ErrnoStatus(errno, "create", tmp);
  return RemoveTemporaryOnError(root, name, save, internal::FsyncPath(root_dir));
}

absl::StatusOr<ShardFile> WriteCheckpointShard(absl::string_view root, absl::string_view name,
                                               uint64_t save, int rank, int world_size,
                                               absl::Span<const TensorSource> tensors,
                                               const CheckpointProgressCallback& progress,
                                               const CheckpointIoOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(CheckDirName(root, name));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not a rank of world size ", world_size));
  }
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const TensorSource& t : tensors) {
    if ((t.data == nullptr) == !t.read) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.key, "' needs exactly one of a host pointer and a reader"));
    }
    entries.push_back({t.key, t.type, t.shape});
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, {}));
  const std::string tmp = CheckpointTempDir(root, name, save);
  if (!internal::Exists(tmp)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", name, "': temporary directory '", tmp, "' is missing (not prepared)"));
  }
  const std::string file_name = ShardFileName(rank, world_size);
  const std::string path = absl::StrCat(tmp, "/", file_name);
  OPTSTEP_ASSIGN_OR_RETURN(File file, internal::OpenForWrite(path));
  absl::StatusOr<ShardFile> shard =
      WriteShardFile(std::move(file), path, file_name, header, entries, tensors, progress, options);
  if (!shard.ok()) {
    // Whatever failed, the partial file goes: a full disk must not stay full.
    absl::Status removed = internal::RemoveTree(path);
    if (!removed.ok()) LOG(WARNING) << "removing a failed shard: " << removed;
  }
  return shard;
}

absl::Status CommitCheckpoint(absl::string_view root, absl::string_view name, uint64_t save,
                              const Manifest& manifest, int keep_last) {
  OPTSTEP_RETURN_IF_ERROR(CheckDirName(root, name));
  if (keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last ", keep_last, " is negative"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::string text, SerializeManifest(manifest));
  OPTSTEP_RETURN_IF_ERROR(RemoveTemporaryOnError(
      root, name, save, PublishCheckpoint(root, name, save, manifest, text)));
  if (keep_last == 0) return absl::OkStatus();
  return PruneCheckpoints(root, name, save, manifest, keep_last);
}

absl::StatusOr<std::vector<std::string>> ListCheckpoints(absl::string_view root) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<Complete> all, CompleteCheckpoints(std::string(root)));
  std::vector<std::string> names;
  for (Complete& c : all) names.push_back(std::move(c.name));
  return names;
}

absl::Status WriteFileAtomically(absl::string_view dir, absl::string_view file,
                                 absl::string_view contents) {
  const std::string path = absl::StrCat(dir, "/", file);
  const std::string temporary = absl::StrCat(dir, "/.", file, ".tmp");
  OPTSTEP_RETURN_IF_ERROR(internal::WriteSmallFile(temporary, contents));
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return internal::ErrnoStatus(errno, "rename into place", path);
  }
  return internal::FsyncPath(std::string(dir));
}

absl::Status SyncDirectory(absl::string_view dir) { return internal::FsyncPath(std::string(dir)); }

absl::StatusOr<std::vector<std::string>> ListCheckpointNames(absl::string_view root) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<std::string> names, internal::ListDir(std::string(root)));
  names.erase(std::remove_if(names.begin(), names.end(),
                             [](const std::string& name) {
                               return !ValidateCheckpointName(name).ok();  // hidden
                             }),
              names.end());
  return names;
}

absl::StatusOr<std::string> ReadFileWhole(const std::string& path, uint64_t max_bytes) {
  return internal::ReadSmallFile(path, max_bytes);
}

}  // namespace optstep
