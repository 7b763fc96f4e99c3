#include "server/rpc/auto_restore.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/temporaries.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "server/engine/session_checkpoint.h"
#include "server/rpc/auto_checkpoint.h"
#include "server/rpc/held_operations.h"

namespace optstep {
namespace {

namespace fs = std::filesystem;

// The definition a checkpoint was saved from (its manifest), named as the record says.
absl::StatusOr<v1::SessionSpec> SpecOf(const std::string& dir, const std::string& checkpoint,
                                       const SessionRecord& record) {
  OPTSTEP_ASSIGN_OR_RETURN(Manifest manifest, ReadManifestFile(CheckpointDir(dir, checkpoint)));
  v1::SessionSpec spec;
  auto parsed = google::protobuf::util::JsonStringToMessage(manifest.definition, &spec);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", dir, "/", checkpoint,
                     "': its session definition does not parse: ", parsed.ToString()));
  }
  spec.set_name(record.name);
  return spec;
}

// `checkpoints` (oldest first by manifest time) ordered by step, oldest first: the newest is the
// one of the highest step whatever its files' times; names without a step go first, in the
// order they came.
void OrderByStep(std::vector<std::string>& checkpoints) {
  // 0 for a name without a step, else its step + 1.
  const auto key = [](const std::string& name) -> uint64_t {
    const std::optional<uint64_t> step = AutoCheckpointStep(name);
    return step.has_value() ? *step + 1 : 0;
  };
  std::stable_sort(checkpoints.begin(), checkpoints.end(),
                   [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
}

// Whether an automatic checkpoint that failed to load or read with `status` is unusable for good
// (its files are damaged, or it is of another format or definition), not for a passing reason.
bool Unusable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kFailedPrecondition;
}

// What a read, creation or load that failed touched, which says which failures are for good.
enum class Source {
  kFile,      // a file of this rank's: NOT_FOUND is its absence
  kCreation,  // the session created on every rank: no room, or a definition refused, is final
  kLoad,      // a load on every rank: NOT_FOUND may be a peer's passing state
};

// Whether `status`, a failure of `source`, is for good: tried again, it would fail again.
bool ForGood(const absl::Status& status, Source source) {
  switch (source) {
    case Source::kFile:
      return Unusable(status) || status.code() == absl::StatusCode::kNotFound;
    case Source::kCreation:
      // Not ALREADY_EXISTS: a replica of a creation given up on may appear on a peer late.
      return Unusable(status) || status.code() == absl::StatusCode::kResourceExhausted ||
             status.code() == absl::StatusCode::kInvalidArgument;
    case Source::kLoad:
      return Unusable(status);
  }
  return true;
}

// Whether `rank` answers a ping within the peer timeout (one ping fails at once while a live
// rank's channel reconnects).
bool AnswersWithinPeerTimeout(RankGroup* group, int rank) {
  const absl::Time until = absl::Now() + group->options().peer_timeout;
  while (!group->Answers(rank)) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return true;
}

// OK while every peer is there and answers; else UNAVAILABLE naming the first that does not (the
// heartbeats may not have judged a rank that just died lost yet).
absl::Status GroupWhole(RankGroup* group) {
  OPTSTEP_RETURN_IF_ERROR(group->PeersStatus());
  for (int r = 0; r < group->world_size(); ++r) {
    if (r != group->rank() && !AnswersWithinPeerTimeout(group, r)) {
      return absl::UnavailableError(absl::StrCat("rank ", r, " does not answer"));
    }
  }
  return absl::OkStatus();
}

// OK unless `failed`, a restore's error, is a passing one and a rank was lost (GroupWhole): then
// UNAVAILABLE saying so.
absl::Status LostRank(RankGroup* group, const absl::Status& failed) {
  if (Unusable(failed)) return absl::OkStatus();
  absl::Status whole = GroupWhole(group);
  if (whole.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("a rank was lost while the sessions were restored (",
                                             whole.message(), "): ", failed.message()));
}

// Sets aside the unusable automatic checkpoint `name` of `dir` under a hidden name (".<name>
// .unusable", which listings, restores and pruning skip; kept for an operator to look at): left
// in place, it would pass for its step saved, and the session would never save that step again,
// so that a later restart fell back past it once more.
void SetAside(const std::string& dir, const std::string& name) {
  const fs::path from = fs::path(dir) / name;
  const fs::path to = fs::path(dir) / absl::StrCat(".", name, ".unusable");
  std::error_code error;
  fs::remove_all(to, error);
  fs::rename(from, to, error);
  if (!error) (void)SyncDirectory(dir);
  LOG(WARNING) << "event=auto_checkpoint_set_aside dir=" << dir << " name=" << name
               << " as=" << to.filename().string() << " error=\""
               << LogValue((error ? error.message() : "")) << "\"";
}

// One restore: the sessions' directories, each session's record, checkpoints and loads, every
// read and load tried again while it fails for a passing reason.
class Restorer {
 public:
  Restorer(const AutoRestoreOptions& options, RankGroup* group)
      : options_(options), group_(group) {}

  // The directories of the sessions under the root's automatic checkpoints, sorted (none when
  // there is no such directory).
  absl::StatusOr<std::vector<std::string>> SessionDirs();

  // Recreates the session of `dir` and loads it from its newest automatic checkpoint that loads;
  // newer ones that are unusable are set aside.
  absl::StatusOr<RestoredSession> RestoreOne(const std::string& dir);

  // Not OK once the restore must end (RestoreAutoCheckpoints): a rank lost, or a read or load
  // that failed for a passing reason every time.
  const absl::Status& interrupted() const { return interrupted_; }

 private:
  // `attempt` until it succeeds, fails for good (ForGood), or was made options_.attempts times:
  // then, failing still for a passing reason, it sets interrupted_. A creation or a load on the
  // group also sets it, at once, when a rank was lost. Answers the last attempt's.
  template <typename T>
  absl::StatusOr<T> Attempt(absl::string_view what, Source source,
                            const std::function<absl::StatusOr<T>()>& attempt);

  const AutoRestoreOptions& options_;
  RankGroup* const group_;
  absl::Status interrupted_;
};

template <typename T>
absl::StatusOr<T> Restorer::Attempt(absl::string_view what, Source source,
                                    const std::function<absl::StatusOr<T>()>& attempt) {
  absl::Duration delay = options_.first_retry;
  for (int n = 1;; ++n) {
    absl::StatusOr<T> result = attempt();
    if (result.ok() || ForGood(result.status(), source)) return result;
    if (source != Source::kFile) {
      interrupted_ = LostRank(group_, result.status());
      if (!interrupted_.ok()) return result;
    }
    if (n >= options_.attempts) {
      interrupted_ = absl::UnavailableError(absl::StrCat(
          what, " failed for a passing reason ", n, " times, the last: ", result.status().message(),
          "; an older checkpoint is not tried instead, nor is the session left out"));
      return result;
    }
    LOG(WARNING) << "event=auto_restore_retry what=\"" << LogValue(what) << "\" attempt=" << n
                 << " retry_in=\"" << absl::FormatDuration(delay) << "\" error=\""
                 << LogValue(result.status().message()) << "\"";
    if (options_.before_retry) options_.before_retry(result.status());
    absl::SleepFor(delay);
    delay *= 2;
  }
}

absl::StatusOr<std::vector<std::string>> Restorer::SessionDirs() {
  const fs::path auto_root = fs::path(options_.checkpoint_root) / kAutoCheckpointDir;
  return Attempt<std::vector<std::string>>(
      absl::StrCat("listing '", auto_root.string(), "'"), Source::kFile,
      [&]() -> absl::StatusOr<std::vector<std::string>> {
        std::vector<std::string> dirs;
        std::error_code error;
        fs::directory_iterator it(auto_root, error);
        if (error == std::errc::no_such_file_or_directory || error == std::errc::not_a_directory) {
          return dirs;  // no automatic checkpoints
        }
        std::string entry;  // the one that could not be looked at
        for (; !error && it != fs::directory_iterator(); it.increment(error)) {
          const std::string name = it->path().filename().string();
          const bool session = ValidateCheckpointName(name).ok();
          const bool closed = absl::StartsWith(name, ".") && absl::EndsWith(name, ".closed");
          if (!session && !closed) continue;  // nothing of the sessions'
          const bool directory = it->is_directory(error);
          if (error == std::errc::no_such_file_or_directory) {
            error.clear();  // removed meanwhile
            continue;
          }
          // A session's that cannot be looked at (a link, or a file system that does not tell
          // an entry's type, whose stat failed) is not skipped: the next increment would clear
          // the error, and the session be left out.
          if (error) {
            entry = absl::StrCat(": look at '", it->path().string(), "'");
            break;
          }
          if (!directory) continue;
          if (session) {
            dirs.push_back(it->path().string());
          } else {
            std::error_code removed;  // a closed session's, hidden before a crash cut its removal
            fs::remove_all(it->path(), removed);
          }
        }
        if (error) {
          return absl::InternalError(
              absl::StrCat("list '", auto_root.string(), "'", entry, ": ", error.message()));
        }
        std::sort(dirs.begin(), dirs.end());
        return dirs;
      });
}

absl::StatusOr<RestoredSession> Restorer::RestoreOne(const std::string& dir) {
  OPTSTEP_ASSIGN_OR_RETURN(
      SessionRecord record,
      Attempt<SessionRecord>(absl::StrCat("reading the session record of '", dir, "'"),
                             Source::kFile, [&] { return ReadSessionRecord(dir); }));
  if (record.session_id != fs::path(dir).filename().string()) {
    return absl::DataLossError(
        absl::StrCat("'", dir, "' holds the record of session '", record.session_id, "'"));
  }
  if (options_.temp_max_age > absl::ZeroDuration()) {
    (void)SweepStaleCheckpointTemporaries(dir, options_.temp_max_age);
  }
  // The names only: each checkpoint's manifest is read as it is tried, so that one that does
  // not read (for good or not) is looked at only when the newer ones did not load.
  OPTSTEP_ASSIGN_OR_RETURN(
      std::vector<std::string> checkpoints,
      Attempt<std::vector<std::string>>(absl::StrCat("listing the checkpoints of '", dir, "'"),
                                        Source::kFile, [&] { return ListCheckpointNames(dir); }));
  OrderByStep(checkpoints);
  std::shared_ptr<Session> session;
  absl::Status failed =
      absl::NotFoundError(absl::StrCat("'", dir, "' holds no complete checkpoint"));
  std::vector<std::string> unusable;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {  // newest first
    const std::string name = absl::StrCat(kAutoCheckpointDir, "/", record.session_id, "/", *it);
    // Its manifest: NOT_FOUND, an incomplete save's directory, is passed over.
    absl::StatusOr<v1::SessionSpec> spec =
        Attempt<v1::SessionSpec>(absl::StrCat("reading the manifest of '", name, "'"),
                                 Source::kFile, [&] { return SpecOf(dir, *it, record); });
    if (!interrupted_.ok()) return spec.status();
    if (!spec.ok()) {
      if (spec.status().code() != absl::StatusCode::kNotFound) failed = spec.status();
      if (Unusable(spec.status())) unusable.push_back(*it);
      continue;
    }
    if (session == nullptr) {
      absl::StatusOr<std::shared_ptr<Session>> made = Attempt<std::shared_ptr<Session>>(
          absl::StrCat("creating session '", record.session_id, "' on every rank"),
          Source::kCreation, [&] {
            return group_->RestoreSession(record.session_id, *spec, record.owner,
                                          record.request_id);
          });
      if (!made.ok()) return made.status();
      session = *std::move(made);
      if (options_.before_load) options_.before_load(record.session_id);
    }
    absl::StatusOr<uint64_t> step =
        Attempt<uint64_t>(absl::StrCat("loading '", name, "'"), Source::kLoad, [&] {
          return HeldOperations(group_).LoadCheckpoint(*session, name, nullptr,
                                                       /*restoring=*/true);
        });
    if (step.ok()) {
      for (const std::string& newer : unusable) SetAside(dir, newer);
      return RestoredSession{record.session_id, *step, name};
    }
    // Not an older checkpoint: the group restarts and loads this one.
    if (!interrupted_.ok()) return step.status();
    LOG(WARNING) << "event=auto_checkpoint_unusable session=" << record.session_id
                 << " name=" << name << " error=\"" << LogValue(step.status().message()) << "\"";
    failed = step.status();
    if (Unusable(failed)) unusable.push_back(*it);
  }
  if (session != nullptr) (void)group_->DropSession(record.session_id);
  return failed;
}

// Removes what a crash left set aside in a session's directory of automatic checkpoints
// (".step-<N>.abandoned": a timeline the session left, hidden before its removal).
void RemoveAbandoned(const std::string& dir) {
  std::error_code error;
  std::vector<fs::path> abandoned;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (absl::StartsWith(name, ".step-") && absl::EndsWith(name, ".abandoned")) {
      abandoned.push_back(it->path());
    }
  }
  for (const fs::path& path : abandoned) fs::remove_all(path, error);
}

}  // namespace

absl::StatusOr<std::vector<RestoredSession>> RestoreAutoCheckpoints(
    const AutoRestoreOptions& options, RankGroup* group) {
  std::vector<RestoredSession> restored;
  if (options.checkpoint_root.empty()) return restored;
  Restorer restorer(options, group);
  absl::StatusOr<std::vector<std::string>> dirs = restorer.SessionDirs();
  for (const std::string& dir : dirs.ok() ? *dirs : std::vector<std::string>()) {
    RemoveAbandoned(dir);
    absl::StatusOr<RestoredSession> one = restorer.RestoreOne(dir);
    if (!restorer.interrupted().ok()) break;
    if (!one.ok()) {
      LOG(ERROR) << "event=session_restore_failed dir=" << dir << " error=\""
                 << LogValue(one.status().message()) << "\"";
      continue;
    }
    LOG(INFO) << "event=session_restored session=" << one->session_id << " step=" << one->step
              << " from=" << one->from;
    restored.push_back(*std::move(one));
  }
  if (!restorer.interrupted().ok()) {
    LOG(ERROR) << "event=restore_interrupted error=\"" << LogValue(restorer.interrupted().message())
               << "\"";
    return restorer.interrupted();
  }
  return restored;
}

}  // namespace optstep
