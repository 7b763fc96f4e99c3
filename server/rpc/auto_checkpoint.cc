#include "server/rpc/auto_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/temporaries.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "server/engine/session_checkpoint.h"
#include "server/rpc/convert.h"
#include "server/rpc/held_operations.h"

namespace optstep {
namespace {

namespace fs = std::filesystem;

constexpr char kRecordFile[] = "session.json";

// Writes the record of `session` into `dir` unless a readable one is there (one left empty or
// partial by a crash is written again): a temporary file, fsynced and renamed into place, then
// `dir` and its parent fsynced, so that a reader sees the whole record or none, after a crash too.
absl::Status EnsureSessionRecord(const std::string& dir, const Session& session) {
  if (ReadSessionRecord(dir).ok()) return absl::OkStatus();
  const nlohmann::json record = {{"session_id", session.id()},
                                 {"name", session.config().name},
                                 {"owner", session.config().owner},
                                 {"request_id", session.config().request_id}};
  OPTSTEP_RETURN_IF_ERROR(WriteFileAtomically(dir, kRecordFile, record.dump() + "\n"));
  return SyncDirectory(fs::path(dir).parent_path().string());  // `dir` itself, made just now
}

}  // namespace

absl::StatusOr<SessionRecord> ReadSessionRecord(const std::string& dir) {
  constexpr uint64_t kMaxRecordBytes = 1 << 20;  // four short strings
  const std::string path = (fs::path(dir) / kRecordFile).string();
  OPTSTEP_ASSIGN_OR_RETURN(std::string text, ReadFileWhole(path, kMaxRecordBytes));
  const nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("session_id") || !record["session_id"].is_string() ||
      !record.value("name", nlohmann::json()).is_string() ||
      !record.value("owner", nlohmann::json()).is_string() ||
      !record.value("request_id", nlohmann::json("")).is_string()) {
    return absl::DataLossError(absl::StrCat("session record '", path,
                                            "' is not an object with string fields session_id, "
                                            "name and owner (and request_id)"));
  }
  return SessionRecord{record["session_id"].get<std::string>(), record["name"].get<std::string>(),
                       record["owner"].get<std::string>(),
                       record.value("request_id", std::string())};
}

absl::Duration RetryDelay(absl::Duration retry_after, absl::Duration max_retry_after,
                          int failures) {
  absl::Duration delay = retry_after;
  for (int i = 1; i < failures && delay < max_retry_after; ++i) delay *= 2;
  return std::min(delay, max_retry_after);
}

AutoCheckpointer::AutoCheckpointer(AutoCheckpointOptions options, Engine* engine, RankGroup* group)
    : options_(std::move(options)), engine_(engine), group_(group) {}

AutoCheckpointer::~AutoCheckpointer() { Stop(); }

void AutoCheckpointer::Start() {
  absl::MutexLock lock(&mu_);
  if (stopping_ || thread_.joinable() || !AutoCheckpointsEnabled(options_)) return;
  thread_ = std::thread([this] { Run(); });
}

void AutoCheckpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Start no longer touches thread_ once stopping_ is set.
  if (thread_.joinable()) thread_.join();
}

void AutoCheckpointer::Restored(const std::string& id, uint64_t step) {
  // The restore's own Load is the timeline's start, not a replacement of it.
  uint64_t replacements = 0;
  if (engine_ != nullptr) {
    absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(id);
    if (session.ok()) replacements = (*session)->stats().state_replacements;
  }
  {
    absl::MutexLock lock(&mu_);
    Track& track = tracks_[id];
    track.saved_step = step;
    track.replacements = replacements;
    track.saved_at = absl::Now();
  }
  // Newer ones the restore passed over (they failed to load for a passing reason) belong to the
  // timeline the group left: kept, one would pass for the new timeline's save of its step, and a
  // later restart would restore it over everything stepped since.
  RemoveCheckpointsFrom(id, step + 1);
}

void AutoCheckpointer::SessionClosed(const std::string& id) {
  {
    // Marked closed once no commit of the session runs (a commit checks the mark under
    // commits_->mu): a save commits before the removal below, or not at all.
    absl::MutexLock lock(&commits_->mu);
    commits_->AwaitNoCommitOf(id);
    commits_->kept.erase(id);
    absl::MutexLock closing(&mu_);
    closed_.insert(id);
    tracks_.erase(id);
  }
  // Now, also while a save of the session runs (its temporary goes with them, so it commits
  // nothing; SaveNow removes what it made meanwhile once it is done): the close is told before
  // any rank drops the session, and left to the save's end, a rank 0 lost meanwhile left them
  // for a restart to bring the closed session back.
  RemoveCheckpointsOf(id);
}

void AutoCheckpointer::RemoveCheckpointsOf(const std::string& id) const {
  // Hidden first (a rename, made durable), so that a crash or an I/O error halfway never leaves
  // the closed session's record and some of its checkpoints for a restart to bring it back.
  const fs::path dir = AutoCheckpointRoot(options_.checkpoint_root, id);
  const fs::path hidden = dir.parent_path() / absl::StrCat(".", id, ".closed");
  std::error_code error;
  fs::remove_all(hidden, error);
  fs::rename(dir, hidden, error);
  std::error_code absent;
  if (!error || !fs::exists(dir, absent)) {
    (void)SyncDirectory(dir.parent_path().string());
    error.clear();
    fs::remove_all(hidden, error);  // a leftover of a crash here goes at the next restore
  }
  if (error) {
    LOG(WARNING) << "event=auto_checkpoints_remove_failed session=" << id << " error=\""
                 << LogValue(error.message()) << "\"";
  }
}

namespace {

// Removes the checkpoints `hidden` (set aside by HideCheckpointsFrom) of session `id`.
void RemoveHidden(const std::string& id, const std::vector<HiddenCheckpoint>& hidden) {
  for (const HiddenCheckpoint& checkpoint : hidden) {
    std::error_code error;
    fs::remove_all(checkpoint.hidden, error);
    LOG_IF(WARNING, error) << "event=auto_checkpoints_remove_failed session=" << id << " error=\""
                           << LogValue(error.message()) << "\"";
  }
}

}  // namespace

absl::StatusOr<RankGroupOptions::ReplacementDone> AutoCheckpointer::Replacing(
    const std::string& id, uint64_t from_step, std::optional<uint64_t> kept_step) {
  {
    // A save of the session being committed ends first: its checkpoint is then one of those
    // set aside. Sessions are marked alone, so that no other session's save waits for this.
    absl::MutexLock lock(&commits_->mu);
    commits_->AwaitNoCommitOf(id);
    commits_->replacing.insert(id);
  }
  std::vector<HiddenCheckpoint> hidden;
  absl::Status status;
  {
    absl::MutexLock hiding(&commits_->hiding);
    status = HideCheckpointsFrom(id, from_step, &hidden);
  }
  auto done = [commits = commits_, id, dir = AutoCheckpointRoot(options_.checkpoint_root, id),
               hidden, kept_step](bool applied) {
    if (!applied) BringBack(*commits, id, dir, hidden);
    absl::MutexLock lock(&commits->mu);
    if (applied) {
      commits->to_remove.emplace_back(id, hidden);
      if (kept_step.has_value()) {
        commits->kept[id] = *kept_step;
      } else {
        commits->kept.erase(id);  // a later replacement's timeline
      }
    }
    commits->replacing.erase(commits->replacing.find(id));
  };
  if (!status.ok()) {
    done(false);  // nothing is applied: what was set aside comes back
    return status;
  }
  return RankGroupOptions::ReplacementDone(std::move(done));
}

void AutoCheckpointer::BringBack(Commits& commits, const std::string& id, const std::string& dir,
                                 const std::vector<HiddenCheckpoint>& hidden) {
  if (hidden.empty()) return;
  absl::MutexLock hiding(&commits.hiding);
  std::error_code error;
  for (const HiddenCheckpoint& checkpoint : hidden) {
    std::error_code renamed;
    fs::rename(checkpoint.hidden, checkpoint.path, renamed);
    if (renamed) error = renamed;
  }
  absl::Status status =
      error ? absl::InternalError(absl::StrCat("cannot bring back: ", error.message()))
            : SyncDirectory(dir);
  LOG_IF(WARNING, !status.ok()) << "event=auto_checkpoints_restore_failed session=" << id
                                << " error=\"" << LogValue(status.message()) << "\"";
  LOG_IF(INFO, status.ok()) << "event=auto_checkpoints_kept session=" << id
                            << " count=" << hidden.size()
                            << " the replacement that set them aside was not applied";
}

absl::Status AutoCheckpointer::HideCheckpointsFrom(const std::string& id, uint64_t step,
                                                   std::vector<HiddenCheckpoint>* hidden) const {
  const fs::path dir = AutoCheckpointRoot(options_.checkpoint_root, id);
  std::error_code error;
  std::vector<fs::path> found;
  if (fs::exists(dir, error)) {
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      const std::optional<uint64_t> saved = AutoCheckpointStep(it->path().filename().string());
      if (saved.has_value() && *saved >= step) found.push_back(it->path());
    }
  }
  // All of them renamed, then made durable, so that a crash halfway never leaves a later one
  // for a restore to take.
  for (const fs::path& path : found) {
    if (error) break;
    const fs::path to = dir / absl::StrCat(".", path.filename().string(), ".abandoned");
    fs::remove_all(to, error);
    if (!error) fs::rename(path, to, error);
    if (error == std::errc::no_such_file_or_directory) {
      error.clear();  // set aside meanwhile by another look
      continue;
    }
    if (!error) hidden->push_back({path, to});
  }
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot set aside the automatic checkpoints of "
                     "session '",
                     id, "' from step ", step, " in '", dir.string(), "': ", error.message()));
  }
  if (hidden->empty()) return absl::OkStatus();
  LOG(INFO) << "event=auto_checkpoints_abandoned session=" << id << " from_step=" << step
            << " count=" << hidden->size() << " the session was taken back to step " << step;
  return SyncDirectory(dir.string());
}

void AutoCheckpointer::RemoveCheckpointsFrom(const std::string& id, uint64_t step) const {
  std::vector<HiddenCheckpoint> hidden;
  absl::Status status;
  {
    absl::MutexLock hiding(&commits_->hiding);
    status = HideCheckpointsFrom(id, step, &hidden);
  }
  RemoveHidden(id, hidden);
  if (status.ok()) return;
  LOG(WARNING) << "event=auto_checkpoints_remove_failed session=" << id << " error=\""
               << LogValue(status.message()) << "\"";
  // Those not set aside go as they are: the look that abandons them does not come again.
  const fs::path dir = AutoCheckpointRoot(options_.checkpoint_root, id);
  std::error_code error;
  std::vector<fs::path> left;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::optional<uint64_t> saved = AutoCheckpointStep(it->path().filename().string());
    if (saved.has_value() && *saved >= step) left.push_back(it->path());
  }
  for (const fs::path& path : left) fs::remove_all(path, error);
}

bool AutoCheckpointer::Due(const Session& session, absl::Time now, std::optional<uint64_t> kept,
                           std::optional<uint64_t>* went_back_to) {
  auto [it, added] = tracks_.try_emplace(session.id());
  Track& track = it->second;
  const Session::Replacements replaced = session.ReplacementsSince(track.replacements);
  const uint64_t step = session.stats().step;
  if (added) {
    track.saved_at = now;
    track.replacements = replaced.count;
  }
  // Told by the replacements, not only by the step: a session loaded back that stepped past its
  // last save before this look, or whose state was imported at the same step, is another
  // timeline too, from the lowest step a replacement set.
  if (!added && replaced.lowest_step.has_value() && kept.has_value() &&
      *replaced.lowest_step >= *kept && step >= *kept) {
    // The replacements since loaded the session's own automatic checkpoint of step `kept` last:
    // the new timeline's save of that step.
    track.replacements = replaced.count;
    *went_back_to = *kept + 1;
    track.saved_step = *kept;
    track.saved_at = now;
    track.failures = 0;
    track.not_before = absl::InfinitePast();
  } else if (!added && replaced.lowest_step.has_value()) {
    track.replacements = replaced.count;
    *went_back_to = std::min(step, *replaced.lowest_step);
    track.saved_step = 0;  // the next save starts the session's new timeline
    track.not_before = absl::InfinitePast();
  } else if (step < track.saved_step) {
    *went_back_to = step;
    track.saved_step = 0;  // the next save starts the session's new timeline
    track.not_before = absl::InfinitePast();
  }
  if (step <= track.saved_step || now < track.not_before) return false;
  if (track.saved_step == 0) return true;  // its first applied step
  if (options_.every_steps > 0 && step - track.saved_step >= uint64_t(options_.every_steps)) {
    return true;
  }
  return options_.every > absl::ZeroDuration() && now - track.saved_at >= options_.every;
}

void AutoCheckpointer::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval)) return;
    }
    LookOnce();
  }
}

size_t AutoCheckpointer::RememberedSessions() const {
  absl::MutexLock lock(&mu_);
  std::set<std::string> ids = closed_;
  for (const auto& [id, track] : tracks_) ids.insert(id);
  return ids.size();
}

void AutoCheckpointer::ForgetAllBut(const std::vector<std::shared_ptr<Session>>& open) {
  std::set<std::string> kept = {saving_};
  for (const std::shared_ptr<Session>& session : open) kept.insert(session->id());
  for (auto it = closed_.begin(); it != closed_.end();) {
    it = kept.count(*it) > 0 ? std::next(it) : closed_.erase(it);
  }
  for (auto it = tracks_.begin(); it != tracks_.end();) {
    it = kept.count(it->first) > 0 ? std::next(it) : tracks_.erase(it);
  }
}

void AutoCheckpointer::LookOnce() {
  // What replacements applied set aside, removed out of their operations' holds.
  std::vector<std::pair<std::string, std::vector<HiddenCheckpoint>>> to_remove;
  {
    absl::MutexLock lock(&commits_->mu);
    to_remove.swap(commits_->to_remove);
  }
  for (const auto& [id, hidden] : to_remove) RemoveHidden(id, hidden);
  if (!group_->PeersStatus().ok()) return;  // the group is broken: nothing can be saved
  const std::vector<std::shared_ptr<Session>> sessions = engine_->ListSessions();
  {
    absl::MutexLock lock(&mu_);
    ForgetAllBut(sessions);
  }
  for (const std::shared_ptr<Session>& session : sessions) {
    std::optional<uint64_t> went_back_to;
    bool due = false;
    {
      // One being replaced is looked at once that is done (it may have applied on some ranks).
      // Held while the replacements are read (Due), so that none is applied and told between.
      absl::MutexLock commits(&commits_->mu);
      if (commits_->replacing.count(session->id()) > 0) continue;
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (closed_.count(session->id()) > 0) continue;
      std::optional<uint64_t> kept;
      auto it = commits_->kept.find(session->id());
      if (it != commits_->kept.end()) {
        kept = it->second;
        commits_->kept.erase(it);
      }
      due = Due(*session, absl::Now(), kept, &went_back_to);
    }
    // Also when not due yet (a session taken back to step 0 is saved after its first step).
    if (went_back_to.has_value()) RemoveCheckpointsFrom(session->id(), *went_back_to);
    if (!due) continue;
    bool replaced = false;
    absl::StatusOr<uint64_t> saved = SaveNow(*session, &replaced);
    absl::MutexLock lock(&mu_);
    auto it = tracks_.find(session->id());
    if (it == tracks_.end()) continue;  // closed meanwhile
    Track& track = it->second;
    if (saved.ok()) {
      track.saved_step = *saved;
      track.saved_at = absl::Now();
      track.failures = 0;
    } else if (replaced) {
      track.not_before = absl::InfinitePast();  // the next look takes the new timeline
    } else {
      track.not_before = absl::Now() + RetryDelay(options_.retry_after, options_.max_retry_after,
                                                  ++track.failures);
    }
  }
}

absl::StatusOr<uint64_t> AutoCheckpointer::SaveNow(Session& session, bool* replaced_meanwhile) {
  const std::string id = session.id();
  std::optional<uint64_t> replacements;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.count(id) > 0) return SessionNotFoundError(id);
    saving_ = id;
    auto it = tracks_.find(id);
    if (it != tracks_.end()) replacements = it->second.replacements;
  }
  bool replaced = false;
  const absl::Time start = absl::Now();
  absl::Duration held;
  absl::StatusOr<uint64_t> saved = [&]() -> absl::StatusOr<uint64_t> {
    OPTSTEP_ASSIGN_OR_RETURN(const std::string definition, DefinitionJson(session));
    const std::string dir = AutoCheckpointRoot(options_.checkpoint_root, id);
    std::error_code error;
    fs::create_directories(dir, error);
    if (error) {
      return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", error.message()));
    }
    OPTSTEP_RETURN_IF_ERROR(EnsureSessionRecord(dir, session));
    if (options_.temp_max_age > absl::ZeroDuration()) {
      (void)SweepStaleCheckpointTemporaries(dir, options_.temp_max_age);
    }
    return SaveShards(session, definition, held, replacements, replaced);
  }();
  if (replaced_meanwhile != nullptr) *replaced_meanwhile = replaced;
  const absl::Duration total = absl::Now() - start;
  bool closed = false;
  {
    absl::MutexLock lock(&mu_);
    saving_.clear();
    closed = closed_.count(id) > 0;
  }
  if (closed) {
    RemoveCheckpointsOf(id);
    return SessionNotFoundError(id);
  }
  if (saved.ok()) {
    LOG(INFO) << "event=auto_checkpoint session=" << id << " step=" << *saved
              << " held_ms=" << absl::ToInt64Milliseconds(held)
              << " total_ms=" << absl::ToInt64Milliseconds(total);
    if (options_.on_saved) options_.on_saved(AutoCheckpointSaved{id, *saved, held, total});
  } else if (replaced) {
    LOG(INFO) << "event=auto_checkpoint_deferred session=" << id << " why=\""
              << LogValue(saved.status().message()) << "\"";
  } else {
    LOG(WARNING) << "event=auto_checkpoint_failed session=" << id << " error=\""
                 << LogValue(saved.status().message()) << "\"";
    if (options_.on_failed) options_.on_failed(id, saved.status());
  }
  return saved;
}

absl::StatusOr<uint64_t> AutoCheckpointer::SaveShards(Session& session,
                                                      const std::string& definition,
                                                      absl::Duration& held,
                                                      std::optional<uint64_t> replacements,
                                                      bool& replaced_meanwhile) {
  const int world = group_->world_size();
  std::vector<ShardFile> shards(world);
  HeldPoint at;
  CheckpointLocation where;
  bool prepared = false;
  bool exists = false;
  uint64_t snapshot_replacements = 0;  // the session's, as its snapshot was taken
  // The temporary of the step the session is at now, made before the hold: the hold settles
  // there unless a step is running, and the fsync of the root then stays out of the held time.
  OPTSTEP_ASSIGN_OR_RETURN(
      const CheckpointLocation guess,
      LocateCheckpoint(options_.checkpoint_root,
                       AutoCheckpointName(session.id(), session.stats().step), true));
  std::error_code error;
  const uint64_t token = HeldOperations::NewToken();  // also the save's: its temporary's name
  const bool guessed = !fs::exists(CheckpointDir(guess.root, guess.name), error) &&
                       PrepareCheckpoint(guess.root, guess.name, token).ok();
  absl::Status status = HeldOperations(group_).WithHeldSession(
      session, token, [&](uint64_t, const HeldPoint& point) -> absl::Status {
        // Under the hold no replacement applies: the state saved is the one whose replacements
        // the checkpointer saw, or the save would stand for a timeline it did not start yet.
        if (replacements.has_value() && session.stats().state_replacements != *replacements) {
          replaced_meanwhile = true;
          return absl::AbortedError(absl::StrCat(
              "session '", session.id(),
              "': its state was replaced while the save waited; saved at the next look"));
        }
        const absl::Time settled = absl::Now();
        snapshot_replacements = session.stats().state_replacements;
        at = point;
        const std::string name = AutoCheckpointName(session.id(), point.step);
        OPTSTEP_ASSIGN_OR_RETURN(
            where, LocateCheckpoint(options_.checkpoint_root, name, /*allow_auto=*/true));
        exists = fs::exists(CheckpointDir(where.root, where.name), error);
        if (exists) return absl::OkStatus();  // this step is saved already
        if (!guessed || where.name != guess.name) {
          OPTSTEP_RETURN_IF_ERROR(PrepareCheckpoint(where.root, where.name, token));
        }
        prepared = true;
        // Each rank snapshots its shard, lets its steps go on, then writes it.
        return group_->ForEachRank([&](int r) -> absl::Status {
          if (r == 0) {
            OPTSTEP_ASSIGN_OR_RETURN(
                shards[0],
                WriteSnapshotShard(session, token, where, group_->options().hold_lease, [&] {
                  (void)session.holds().Release(token);
                  held = absl::Now() - settled;
                }));
            return absl::OkStatus();
          }
          v1::HeldSessionRequest request;
          request.set_session_id(session.id());
          request.set_token(token);
          request.set_lease_ms(absl::ToInt64Milliseconds(group_->options().hold_lease));
          request.set_checkpoint_name(name);
          OPTSTEP_ASSIGN_OR_RETURN(
              v1::HeldSessionResponse response,
              group_->CallPeer(r, &v1::PeerService::Stub::SaveShard, request,
                               "waiting for its shard to be written", kShardCallTimeout));
          shards[r] =
              ShardFile{response.shard_file(), response.shard_bytes(), response.shard_crc32c()};
          return absl::OkStatus();
        });
      });
  if (guessed && (where.name != guess.name || !prepared)) {
    (void)AbandonCheckpoint(guess.root, guess.name, token);  // the hold settled elsewhere
  }
  if (status.ok() && !exists) {
    // A replacement since the snapshot, or one under way (Replacing set aside the checkpoints of
    // the timeline it leaves), took the session from the timeline this save belongs to:
    // committed, it would stand for it, and a restart would restore it over the new state.
    bool replaced = false;
    bool closed = false;
    {
      absl::MutexLock lock(&commits_->mu);
      replaced = commits_->replacing.count(session.id()) > 0 ||
                 session.stats().state_replacements != snapshot_replacements;
      {
        // Closed since the save began (SessionClosed marks it under commits_->mu, once no
        // commit of it runs): its checkpoints went, and a commit now would bring one back.
        absl::MutexLock closing(&mu_);
        closed = closed_.count(session.id()) > 0;
      }
      if (!replaced && !closed) commits_->committing.insert(session.id());
    }
    if (closed) {
      status = SessionNotFoundError(session.id());
    } else if (replaced) {
      replaced_meanwhile = true;
      status = absl::AbortedError(absl::StrCat(
          "session '", session.id(),
          "': its state was replaced while the save was written; saved at the next look"));
    } else {
      status = CommitSessionCheckpoint(session, token, at, where, definition, shards,
                                       std::max(1, options_.keep));
      absl::MutexLock lock(&commits_->mu);
      commits_->committing.erase(session.id());
    }
  }
  if (!status.ok()) {
    if (prepared) {
      absl::Status removed = AbandonCheckpoint(where.root, where.name, token);
      if (!removed.ok()) LOG(WARNING) << "removing the temporary of a failed save: " << removed;
    }
    return status;
  }
  return at.step;
}

}  // namespace optstep
