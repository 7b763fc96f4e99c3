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

// Whether an automatic checkpoint that failed to load with `status` is unusable for good (its
// files are damaged, or it is of another format or definition), not for a passing reason.
bool Unusable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kFailedPrecondition;
}

// How often a load of one automatic checkpoint that failed for a passing reason (anything but
// Unusable: a peer or the disk busy or slow, a hold cut short) is tried in all before an older
// checkpoint is, the first retry this long after, each further one twice as long. Falling back
// costs steps (the trainers rewind), and a good checkpoint is never set aside for such a reason.
constexpr int kLoadAttempts = 3;
constexpr absl::Duration kFirstLoadRetry = absl::Seconds(1);

// Loads `name` into `session` on every rank, tried again while it fails for a passing reason.
absl::StatusOr<uint64_t> LoadRetrying(RankGroup* group, Session& session, const std::string& name) {
  absl::Duration delay = kFirstLoadRetry;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<uint64_t> step =
        HeldOperations(group).LoadCheckpoint(session, name, nullptr, /*restoring=*/true);
    if (step.ok() || Unusable(step.status()) || attempt == kLoadAttempts) return step;
    LOG(WARNING) << "event=auto_checkpoint_load_retry session=" << session.id() << " name=" << name
                 << " attempt=" << attempt << " retry_in=\"" << absl::FormatDuration(delay)
                 << "\" error=\"" << LogValue(step.status().message()) << "\"";
    absl::SleepFor(delay);
    delay *= 2;
  }
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
// UNAVAILABLE saying so, and the whole restore ends.
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

// Recreates the session of `dir` and loads it from its newest automatic checkpoint that loads;
// newer ones that are unusable are set aside. A rank lost meanwhile (LostRank) ends it at once,
// into `*lost_rank`.
absl::StatusOr<RestoredSession> RestoreOne(
    const std::string& dir, absl::Duration temp_max_age, RankGroup* group,
    const std::function<void(const std::string& session_id)>& before_load,
    absl::Status* lost_rank) {
  OPTSTEP_ASSIGN_OR_RETURN(SessionRecord record, ReadSessionRecord(dir));
  if (record.session_id != fs::path(dir).filename().string()) {
    return absl::DataLossError(
        absl::StrCat("'", dir, "' holds the record of session '", record.session_id, "'"));
  }
  if (temp_max_age > absl::ZeroDuration()) {
    (void)SweepStaleCheckpointTemporaries(dir, temp_max_age);
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, ListCheckpoints(dir));
  if (checkpoints.empty()) {
    return absl::NotFoundError(absl::StrCat("'", dir, "' holds no complete checkpoint"));
  }
  OrderByStep(checkpoints);
  std::shared_ptr<Session> session;
  absl::Status failed = absl::OkStatus();
  std::vector<std::string> unusable;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {  // newest first
    const std::string name = absl::StrCat(kAutoCheckpointDir, "/", record.session_id, "/", *it);
    if (session == nullptr) {
      absl::StatusOr<v1::SessionSpec> spec = SpecOf(dir, *it, record);
      if (!spec.ok()) {
        failed = spec.status();
        if (Unusable(failed)) unusable.push_back(*it);
        continue;
      }
      absl::StatusOr<std::shared_ptr<Session>> made =
          group->RestoreSession(record.session_id, *spec, record.owner, record.request_id);
      if (!made.ok()) {
        *lost_rank = LostRank(group, made.status());
        return made.status();
      }
      session = *std::move(made);
      if (before_load) before_load(record.session_id);
    }
    absl::StatusOr<uint64_t> step = LoadRetrying(group, *session, name);
    if (step.ok()) {
      for (const std::string& newer : unusable) SetAside(dir, newer);
      return RestoredSession{record.session_id, *step, name};
    }
    // Not an older checkpoint for a lost rank's failure: the group restarts and loads this one.
    *lost_rank = LostRank(group, step.status());
    if (!lost_rank->ok()) return step.status();
    LOG(WARNING) << "event=auto_checkpoint_unusable session=" << record.session_id
                 << " name=" << name << " error=\"" << LogValue(step.status().message()) << "\"";
    failed = step.status();
    if (Unusable(failed)) unusable.push_back(*it);
  }
  if (session != nullptr) (void)group->DropSession(record.session_id);
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
    const std::string& checkpoint_root, absl::Duration temp_max_age, RankGroup* group,
    const std::function<void(const std::string& session_id)>& before_load) {
  std::vector<RestoredSession> restored;
  const fs::path auto_root = fs::path(checkpoint_root) / kAutoCheckpointDir;
  std::error_code error;
  if (checkpoint_root.empty() || !fs::is_directory(auto_root, error)) return restored;
  std::vector<std::string> dirs;
  for (const fs::directory_entry& entry : fs::directory_iterator(auto_root, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(error)) continue;
    if (ValidateCheckpointName(name).ok()) {
      dirs.push_back(entry.path().string());
    } else if (absl::StartsWith(name, ".") && absl::EndsWith(name, ".closed")) {
      std::error_code removed;  // a closed session's, hidden before a crash cut its removal
      fs::remove_all(entry.path(), removed);
    }
  }
  std::sort(dirs.begin(), dirs.end());
  for (const std::string& dir : dirs) {
    RemoveAbandoned(dir);
    absl::Status lost_rank;
    absl::StatusOr<RestoredSession> one =
        RestoreOne(dir, temp_max_age, group, before_load, &lost_rank);
    if (!lost_rank.ok()) {
      LOG(ERROR) << "event=restore_interrupted dir=" << dir << " error=\""
                 << LogValue(lost_rank.message()) << "\"";
      return lost_rank;
    }
    if (!one.ok()) {
      LOG(ERROR) << "event=session_restore_failed dir=" << dir << " error=\""
                 << LogValue(one.status().message()) << "\"";
      continue;
    }
    LOG(INFO) << "event=session_restored session=" << one->session_id << " step=" << one->step
              << " from=" << one->from;
    restored.push_back(*std::move(one));
  }
  return restored;
}

}  // namespace optstep
