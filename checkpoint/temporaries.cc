#include "checkpoint/temporaries.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "glog/logging.h"

namespace optstep {
namespace {

constexpr absl::string_view kTempPrefix = ".";
constexpr absl::string_view kTempSuffix = ".tmp";
constexpr size_t kSaveDigits = 16;

// The checkpoint name in the temporary's directory entry `entry`: ".<name>.<16 hex digits>.tmp",
// or ".<name>.tmp" (releases before the save identifiers); nothing for another entry.
std::optional<std::string> TemporaryOf(absl::string_view entry) {
  if (!absl::ConsumePrefix(&entry, kTempPrefix) || !absl::ConsumeSuffix(&entry, kTempSuffix)) {
    return std::nullopt;
  }
  const size_t dot = entry.size() > kSaveDigits ? entry.size() - kSaveDigits - 1 : 0;
  if (dot > 0 && entry[dot] == '.' && std::all_of(entry.begin() + dot + 1, entry.end(), [](char c) {
        return absl::ascii_isxdigit(c) && !absl::ascii_isupper(c);
      })) {
    entry = entry.substr(0, dot);
  }
  if (!ValidateCheckpointName(entry).ok()) return std::nullopt;
  return std::string(entry);
}

absl::Time ModificationTime(const struct stat& st) { return absl::TimeFromTimespec(st.st_mtim); }

// When `dir` or an entry directly in it was last modified (an entry that vanished meanwhile does
// not count).
absl::StatusOr<absl::Time> LastChange(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return internal::ErrnoStatus(errno, "stat", dir);
  absl::Time last = ModificationTime(st);
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<std::string> entries, internal::ListDir(dir));
  for (const std::string& entry : entries) {
    const std::string path = absl::StrCat(dir, "/", entry);
    if (::lstat(path.c_str(), &st) == 0) last = std::max(last, ModificationTime(st));
  }
  return last;
}

}  // namespace

absl::Status AbandonCheckpoint(absl::string_view root, absl::string_view name, uint64_t save) {
  OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(name));
  return internal::RemoveTree(CheckpointTempDir(root, name, save));
}

absl::StatusOr<std::vector<std::string>> SweepStaleCheckpointTemporaries(absl::string_view root,
                                                                         absl::Duration max_age,
                                                                         absl::Time now) {
  const std::string root_dir(root);
  struct stat st;
  if (::stat(root_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint root '", root, "' is not an existing directory"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<std::string> entries, internal::ListDir(root_dir));
  std::vector<std::string> removed;
  for (const std::string& entry : entries) {
    const std::optional<std::string> name = TemporaryOf(entry);
    const std::string dir = absl::StrCat(root_dir, "/", entry);
    if (!name.has_value() || ::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      continue;  // not a temporary of ours
    }
    absl::StatusOr<absl::Time> last = LastChange(dir);
    if (!last.ok()) {
      if (last.status().code() != absl::StatusCode::kNotFound) {
        LOG(WARNING) << "checkpoint temporary '" << dir << "': " << last.status();
      }
      continue;
    }
    if (now - *last <= max_age) continue;  // a save may still be writing it
    absl::Status status = internal::RemoveTree(dir);
    if (!status.ok()) {
      LOG(WARNING) << "removing stale checkpoint temporary '" << dir << "': " << status;
      continue;
    }
    LOG(INFO) << "event=checkpoint_temporary_removed dir='" << dir
              << "' idle_s=" << absl::ToInt64Seconds(now - *last);
    removed.push_back(*name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace optstep
