#ifndef OPTSTEP_SERVER_RPC_AUTO_CHECKPOINT_H_
#define OPTSTEP_SERVER_RPC_AUTO_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"

namespace optstep {

// One automatic checkpoint committed: how long rank 0 kept the session settled (from the settle to
// the release: the copy of its shard to host memory, what its next step waited for at most) and
// the whole save (hold, settle, copy, write, commit).
struct AutoCheckpointSaved {
  std::string session_id;
  uint64_t step = 0;
  absl::Duration held;
  absl::Duration total;
};

struct AutoCheckpointOptions {
  // The group's checkpoint root; automatic checkpoints go to <root>/auto/<session id>/.
  std::string checkpoint_root;
  // A session is saved once this many steps were applied since its last automatic checkpoint
  // (0: never by steps), or once this long passed since it (zero: never by time), whichever
  // comes first; and always after its first applied step.
  int every_steps = 0;
  absl::Duration every = absl::ZeroDuration();
  // Complete automatic checkpoints kept per session (at least 1).
  int keep = 2;
  // How often the sessions' steps are looked at.
  absl::Duration poll_interval = absl::Milliseconds(20);
  // A failed save is tried again after this long at the earliest.
  absl::Duration retry_after = absl::Seconds(1);
  // ... doubled after each failure in a row, up to this (RetryDelay).
  absl::Duration max_retry_after = absl::Minutes(1);
  // Temporaries of the session's interrupted saves idle this long are removed before each save
  // (--checkpoint_temp_max_age_ms; zero: none are): a rank 0 lost in a save and healed back in
  // restores nothing, so its temporary would otherwise stay until the group restarts.
  absl::Duration temp_max_age = absl::ZeroDuration();
  // Told of each checkpoint committed; may be null.
  std::function<void(const AutoCheckpointSaved& saved)> on_saved;
  // Told of each save that failed (a full or broken disk, a rank lost while it wrote its shard),
  // with the session's id and the error; may be null. Not of a session closed meanwhile.
  std::function<void(const std::string& session_id, const absl::Status& why)> on_failed;
};

// Whether `options` asks for automatic checkpoints at all.
inline bool AutoCheckpointsEnabled(const AutoCheckpointOptions& options) {
  return options.every_steps > 0 || options.every > absl::ZeroDuration();
}

// What identifies a session besides its definition, kept beside its automatic checkpoints
// (<root>/auto/<session id>/session.json) so that a restart recreates it as it was.
struct SessionRecord {
  std::string session_id;
  std::string name;
  std::string owner;
  std::string request_id;  // CreateSessionRequest.request_id; absent in older records: empty
};
// Reads the record of the automatic checkpoints in `dir`: NOT_FOUND when there is none,
// DATA_LOSS naming the file when it does not parse, a read that fails otherwise as
// ReadFileWhole's (INTERNAL for EIO).
absl::StatusOr<SessionRecord> ReadSessionRecord(const std::string& dir);

// The wait before the next attempt at a session's automatic checkpoint after `failures` (>= 1)
// failed in a row: `retry_after`, doubled with each further failure, at most `max_retry_after`.
// A passing failure is tried again within a second, and a broken disk is not tried every second
// for ever: each attempt holds the session (its steps pause) and copies its state.
absl::Duration RetryDelay(absl::Duration retry_after, absl::Duration max_retry_after, int failures);

// An automatic checkpoint set aside (AutoCheckpointer::HideCheckpointsFrom): where it was, and
// the hidden name it has now.
struct HiddenCheckpoint {
  std::filesystem::path path;
  std::filesystem::path hidden;
};

// Rank 0's automatic checkpoints (docs/checkpoints.md, "Automatic checkpoints"): a thread looks
// at every session's step and, when a save is due, saves it as "auto/<id>/step-<N>" through the
// held-operation protocol, from a snapshot: each rank copies its shard of the held state to host
// memory, lets its steps go on, and only then writes it, so that steps stall only for the copy.
// Keeps the newest `keep` complete ones per session; a session closed by its owner loses its
// automatic checkpoints (SessionClosed). Sessions are saved one at a time.
// Thread-safe.
class AutoCheckpointer {
 public:
  // `engine` and `group` (rank 0's) must outlive this object. Saves nothing until Start.
  AutoCheckpointer(AutoCheckpointOptions options, Engine* engine, RankGroup* group);
  // Stop().
  ~AutoCheckpointer();
  AutoCheckpointer(const AutoCheckpointer&) = delete;
  AutoCheckpointer& operator=(const AutoCheckpointer&) = delete;

  // Starts the thread; nothing after Stop, nor when `options` ask for no automatic checkpoints
  // (SessionClosed still removes those of a restored session). Once only.
  void Start();
  // Stops the thread after the save in progress (shutdown). Idempotent.
  void Stop();
  // Session `id` was restored at `step` from its automatic checkpoints: the next one is due from
  // there, and those of later steps (a restore passed over them) are removed.
  void Restored(const std::string& id, uint64_t step);
  // Session `id` was closed by its owner: its automatic checkpoints are removed, now or, when
  // one is being written, as soon as it is done; it is never saved again.
  void SessionClosed(const std::string& id);
  // Session `id`'s state is about to be replaced (RankGroupOptions::replacing_state: a Load or a
  // state dict import that every rank staged): its automatic checkpoints of step `from_step` on
  // belong to the timeline it leaves, and are set aside now (renamed, made durable), not at the
  // next look, so that a restart before that never restores them over the new state. Until the
  // answer is told, no save of the session commits, nor after it one whose snapshot came before
  // the replacement. Told applied, they are removed at the next look (outside the operation's
  // hold); told not, they come back. An error (they could not be set aside) fails the
  // replacement, and what was set aside comes back. With `kept_step`, a Load of the session's
  // own automatic checkpoint of that step: told applied, the checkpoint is the new timeline's
  // save of its step, kept as such at the next look (before, a Load of one removed it).
  absl::StatusOr<RankGroupOptions::ReplacementDone> Replacing(
      const std::string& id, uint64_t from_step, std::optional<uint64_t> kept_step = std::nullopt);

  // One look at every session: abandons the checkpoints of a timeline a session left, and saves
  // those due (the thread's look, every poll_interval; tests call it directly).
  void LookOnce();
  // Saves `session` now (the thread's save; tests call it directly). Answers the step saved.
  // ABORTED, with `*replaced_meanwhile` set (when given), when the session's state was replaced
  // after the checkpointer last looked at it, or is being replaced: the next look saves it.
  absl::StatusOr<uint64_t> SaveNow(Session& session, bool* replaced_meanwhile = nullptr);

  // The sessions the checkpointer keeps anything of (a track, or the id of one closed): after a
  // look, only those open then, and a closed one still being saved.
  size_t RememberedSessions() const;

 private:
  struct Track {
    uint64_t saved_step = 0;
    uint64_t replacements = 0;  // the session's SessionStats::state_replacements, as last seen
    absl::Time saved_at;
    absl::Time not_before;  // after a failure
    int failures = 0;       // in a row
  };

  void Run();
  // Forgets the sessions not in `open` (closed, or dropped), but the one being saved: each closed
  // session would otherwise leave its id for ever, and a tenant that creates and closes sessions
  // would grow rank 0 without bound.
  void ForgetAllBut(const std::vector<std::shared_ptr<Session>>& open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `session` is due at `now`. A session whose state was replaced (a Load or an import,
  // of an earlier state or not) or that is behind its last automatic checkpoint left that
  // checkpoint's timeline: due at once, `*went_back_to` its step. `kept`: the step of the
  // session's own automatic checkpoint its last replacement loaded (Commits::kept), then the
  // timeline's save of that step.
  bool Due(const Session& session, absl::Time now, std::optional<uint64_t> kept,
           std::optional<uint64_t>* went_back_to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes session `id`'s automatic checkpoints of step `step` and later: a timeline its
  // session was taken back from, which a restore (the highest step first) would otherwise bring
  // back over what the session stepped since (errors logged).
  void RemoveCheckpointsFrom(const std::string& id, uint64_t step) const;
  struct Commits;
  // Renames `hidden` (session `id`'s, in `dir`) back and makes that durable, errors logged.
  static void BringBack(Commits& commits, const std::string& id, const std::string& dir,
                        const std::vector<HiddenCheckpoint>& hidden);
  // Sets aside (renames to a hidden name, made durable) session `id`'s automatic checkpoints of
  // step `step` and later, adding each to `hidden`; one set aside meanwhile by another look is
  // passed over. The first error otherwise (those in `hidden` were set aside before it).
  // REQUIRES: commits_->hiding held.
  absl::Status HideCheckpointsFrom(const std::string& id, uint64_t step,
                                   std::vector<HiddenCheckpoint>* hidden) const;
  // The save itself, once the session's directory and record exist; `held` gets rank 0's
  // settled time.
  // `replacements`: the session's state replacements as last seen (none: not checked);
  // ABORTED, `replaced_meanwhile` set, when the held session has more, or when a replacement
  // is under way or was applied after the snapshot (nothing committed).
  absl::StatusOr<uint64_t> SaveShards(Session& session, const std::string& definition,
                                      absl::Duration& held, std::optional<uint64_t> replacements,
                                      bool& replaced_meanwhile);
  void RemoveCheckpointsOf(const std::string& id) const;

  const AutoCheckpointOptions options_;
  Engine* const engine_;
  RankGroup* const group_;

  mutable absl::Mutex mu_;
  std::map<std::string, Track> tracks_ ABSL_GUARDED_BY(mu_);
  // Ids closed by their owner (ids are never reused) that a look may still find open: a session
  // listed before its close. Forgotten once a look does not find them (ForgetAllBut).
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::string saving_ ABSL_GUARDED_BY(mu_);  // the id being saved, else empty
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The sessions whose state is being replaced (Replacing: their saves do not commit, and looks
  // pass them over), those whose save commits (a replacement waits for it), what replacements
  // set aside, to be removed at the next look, and the step of the automatic checkpoint a
  // session's last replacement applied loaded, if its own. Shared with Replacing's answers,
  // which may outlive the
  // checkpointer. `hiding` is held while checkpoints are set aside or brought back, so that two
  // never rename the same one.
  struct Commits {
    absl::Mutex mu;
    std::multiset<std::string> replacing ABSL_GUARDED_BY(mu);
    std::set<std::string> committing ABSL_GUARDED_BY(mu);
    std::vector<std::pair<std::string, std::vector<HiddenCheckpoint>>> to_remove
        ABSL_GUARDED_BY(mu);
    std::map<std::string, uint64_t> kept ABSL_GUARDED_BY(mu);
    absl::Mutex hiding;

    // Waits until no save of session `id` commits.
    void AwaitNoCommitOf(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      struct Committing {
        const std::set<std::string>* ids;
        const std::string* id;
      } committing{&this->committing, &id};
      mu.Await(absl::Condition(
          +[](Committing* c) { return c->ids->count(*c->id) == 0; }, &committing));
    }
  };
  const std::shared_ptr<Commits> commits_ = std::make_shared<Commits>();
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_AUTO_CHECKPOINT_H_
