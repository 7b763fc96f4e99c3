#include "server/engine/session.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/log_budget.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/gradient_pieces.h"
#include "server/engine/replica_snapshot.h"

namespace optstep {
namespace {

std::vector<int64_t> OwnedNumels(const ReplicaState& replica) {
  std::vector<int64_t> owned(replica.num_params(), 0);
  for (int p : replica.owned()) owned[p] = replica.numels()[p];
  return owned;
}

}  // namespace

Session::Session(const Options& options, std::unique_ptr<ReplicaState> replica)
    : id_(options.id),
      step_deadline_(options.step_deadline),
      observer_(options.observer ? options.observer : std::make_shared<StepObserver>()),
      on_abort_vote_(options.on_abort_vote),
      ordered_(SumsInTrainerOrder(replica->config())),
      replica_(std::move(replica)),
      gate_(id_, replica_->rank()),
      retention_(id_, options.reserve_held_snapshot),
      book_(id_, replica_->rank(), replica_->config(), OwnedNumels(*replica_), &replica_->names()),
      inflight_of_(std::max(1, replica_->config().num_trainers), 0) {}

Session::~Session() {
  // Tasks hold the session alive, so none is pending here; finish the coordinator first.
  coordinator_.reset();
}

absl::StatusOr<std::shared_ptr<Session>> Session::Create(Options options,
                                                         std::shared_ptr<Device> device,
                                                         std::shared_ptr<FairExecutor> worker) {
  OPTSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<ReplicaState> replica,
      ReplicaState::Create(options.id, std::move(options.config), std::move(options.layout),
                           options.rank, options.max_bytes, std::move(device)));
  std::shared_ptr<Session> session(new Session(options, std::move(replica)));
  StepCoordinator::Options coordinator;
  if (options.state_redundancy && session->layout().world_size > 1) {
    OPTSTEP_ASSIGN_OR_RETURN(session->shadow_, ShadowState::Create(*session->replica_));
    coordinator.shadow = session->shadow_.get();
  }
  coordinator.session_id = session->id_;
  coordinator.owner = session->config().owner;
  coordinator.step_deadline = session->step_deadline_;
  coordinator.observer = session->observer_;
  OPTSTEP_ASSIGN_OR_RETURN(
      session->coordinator_,
      StepCoordinator::Create(std::move(coordinator), session->replica_.get(),
                              std::move(options.comm), std::move(worker), session.get()));
  return session;
}

SessionStats Session::stats() const {
  SessionStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats.step = book_.counters().step;
    stats.skipped_steps = book_.counters().skipped_steps;
    stats.step_running = book_.running();
    stats.state_replacements = state_replacements_;
  }
  const ReplicaState::Bytes bytes = replica_->bytes();
  stats.param_bytes = bytes.params;
  stats.state_bytes = bytes.state;
  stats.buffer_bytes = bytes.buffers;
  if (shadow_ != nullptr) stats.shadow_bytes = ShadowBytes(shadow_->replica());
  return stats;
}

Session::Replacements Session::ReplacementsSince(uint64_t seen) const {
  absl::MutexLock lock(&mu_);
  Replacements since;
  since.count = state_replacements_;
  if (state_replacements_ <= seen) return since;
  // replaced_to_[i] was set by replacement number state_replacements_ - size + i + 1; those
  // before it were let go, and some unseen among them are stood for by the lowest let go.
  const uint64_t first = state_replacements_ - replaced_to_.size() + 1;
  if (seen + 1 < first) since.lowest_step = lowest_let_go_;
  for (size_t i = 0; i < replaced_to_.size(); ++i) {
    if (first + i <= seen) continue;
    since.lowest_step = std::min(since.lowest_step.value_or(replaced_to_[i]), replaced_to_[i]);
  }
  return since;
}

// --- Contributions ---

absl::Status Session::CheckTrainer(int trainer) const {
  const int trainers = config().num_trainers;
  if (trainer >= 0 && trainer < trainers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("trainer_id ", trainer, " out of range: session '",
                                                 id_, "' declares ", trainers, " trainers"));
}

absl::StatusOr<StepHandle> Session::Begin(const StepBegin& begin) {
  OPTSTEP_RETURN_IF_ERROR(CheckTrainer(begin.trainer));
  OPTSTEP_ASSIGN_OR_RETURN(StepSchedule schedule, ResolveSchedule(replica_->DefaultSchedule(),
                                                                  begin.step, begin.schedules));
  std::vector<WaitingChunk> superseded;
  absl::StatusOr<StepHandle> c;
  {
    absl::MutexLock lock(&mu_);
    // A new attempt drops the trainer's ranges: copies of its earlier streams still under way
    // land first, or they would write over what the new attempt (or, SHARDED, another trainer)
    // sends there, and the step would apply bytes its digests do not hold.
    struct Copies {
      const std::vector<int>* of;
      int trainer;
    } copies{&inflight_of_, begin.trainer};
    if (!mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Copies* c) { return (*c->of)[c->trainer] == 0; }, &copies),
                              kEarlierCopiesWait)) {
      return absl::UnavailableError(
          absl::StrCat("session '", id_, "': step ", begin.step, ": a copy of trainer ",
                       begin.trainer, "'s earlier stream to the device did not end within ",
                       absl::FormatDuration(kEarlierCopiesWait), "; begin the step again"));
    }
    c = book_.Begin(begin, std::move(schedule), absl::Now(), &superseded);
  }
  for (WaitingChunk& chunk : superseded) {
    chunk.added(absl::AbortedError(absl::StrCat("step ", begin.step, ": trainer ", begin.trainer,
                                                " began the step again on another stream")));
  }
  return c;
}

absl::Status Session::AddGradient(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                                  const void* data, size_t bytes) {
  const absl::string_view piece(static_cast<const char*>(data), bytes);
  return AddGradient(c, param_id, offset, dtype, absl::MakeConstSpan(&piece, 1));
}

absl::Status Session::AddGradient(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                                  absl::Span<const absl::string_view> pieces) {
  // A chunk of a later trainer may have to wait for its turn: it waits as a copy.
  std::shared_ptr<std::string> copy;
  std::vector<absl::string_view> views(pieces.begin(), pieces.end());
  if (ordered_ && c.trainer > 0) {
    copy = std::make_shared<std::string>();
    for (absl::string_view piece : pieces) copy->append(piece.data(), piece.size());
    views.assign(1, *copy);
  }
  auto added = [id = id_, trainer = c.trainer, param_id](absl::Status status) {
    LOG_IF(WARNING, !status.ok()) << "session " << id << ": a waiting chunk of param " << param_id
                                  << " from trainer " << trainer << " was not added: " << status;
  };
  return AddGradient(c, param_id, offset, dtype, views, std::move(copy), std::move(added)).status();
}

bool Session::WouldWait(const StepHandle& c, int param_id) const {
  // Most chunks never wait: they take no lock here (this is asked of every chunk).
  if (!ordered_ || c.retry || c.replay || param_id < 0 || param_id >= replica_->num_params()) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  return WaitsForTurnLocked(c, param_id);
}

bool Session::WaitsForTurnLocked(const StepHandle& c, int param_id) const {
  // Summed in trainer order: a trainer's chunk waits for those before it on its parameter. A
  // retry's or a replay's is only digested, and never waits.
  return ordered_ && !c.retry && !c.replay && c.trainer > book_.order().turn(param_id);
}

absl::StatusOr<Session::ChunkFate> Session::AddGradient(const StepHandle& c, int param_id,
                                                        int64_t offset, DType dtype,
                                                        absl::Span<const absl::string_view> pieces,
                                                        std::shared_ptr<const void> keep,
                                                        std::function<void(absl::Status)> added) {
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t count,
                           replica_->ElementCount(param_id, dtype, TotalBytes(pieces)));
  if (!replica_->owns(param_id)) {
    return absl::InvalidArgumentError(absl::StrCat("param '", replica_->names()[param_id],
                                                   "' is owned by rank ", layout().owner[param_id],
                                                   ", not rank ", rank()));
  }
  if (c.retry || c.replay) {
    // Already counted once: digested only, for the commit to compare (StepBook::CheckResent).
    ContributionDigest digest;
    digest.Add(param_id, dtype, offset, pieces);
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(book_.CheckFresh(c));
    // Bounded as a first send is: a resend outside the parameter, or in more pieces than a send
    // may come in, would otherwise grow the digest by each message without an error.
    OPTSTEP_RETURN_IF_ERROR(book_.contributions().CheckBounds(param_id, offset, count));
    if (c.resent->chunks() >= book_.contributions().max_ranges()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "param '", replica_->names()[param_id], "': chunk [", offset, ", ", offset + count,
          ") from trainer ", c.trainer, ": its gradients of step ", c.step, " sent again came in ",
          c.resent->chunks(), " pieces already, the most the step's gradients may come in"));
    }
    c.resent->Merge(digest);
    return ChunkFate::kAdded;
  }
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(book_.CheckFresh(c));
    OPTSTEP_RETURN_IF_ERROR(book_.contributions().CheckBounds(param_id, offset, count));
    if (WaitsForTurnLocked(c, param_id)) {
      book_.order().Wait(WaitingChunk{c, param_id, offset, dtype,
                                      std::vector<absl::string_view>(pieces.begin(), pieces.end()),
                                      std::move(keep), std::move(added)});
      return ChunkFate::kWaiting;
    }
  }
  // The turn only moves forward, so it is still this trainer's (or past it: a resend).
  OPTSTEP_RETURN_IF_ERROR(WriteChunk(c, param_id, offset, dtype, pieces));
  return ChunkFate::kAdded;
}

namespace {

// Runs `task` now, unless a RunFlat call on this thread runs tasks already (`task` comes from
// within one): then that call runs it, after the task it is in and those queued before. Tasks
// that start one another so run one after another, not nested on the stack.
void RunFlat(std::function<void()> task) {
  thread_local std::deque<std::function<void()>>* running = nullptr;
  if (running != nullptr) {
    running->push_back(std::move(task));
    return;
  }
  std::deque<std::function<void()>> queue;
  queue.push_back(std::move(task));
  running = &queue;
  while (!queue.empty()) {
    std::function<void()> next = std::move(queue.front());
    queue.pop_front();
    next();
  }
  running = nullptr;
}

}  // namespace

absl::Status Session::WriteChunk(const StepHandle& c, int param_id, int64_t offset, DType dtype,
                                 absl::Span<const absl::string_view> pieces) {
  const size_t size = DTypeSize(dtype);
  const int64_t count = static_cast<int64_t>(TotalBytes(pieces) / size);
  ContributionDigest digest;  // hashed outside the lock
  digest.Add(param_id, dtype, offset, pieces);
  std::vector<ElementRange> fresh;
  {
    absl::MutexLock lock(&mu_);
    // Not while a statistics task reads the buffer (a SHARDED trainer that began again, or the
    // next step after an abort): that one task, a read of one gradient, ends first.
    struct Reading {
      const GradientStatistics* statistics;
      int param;
    } reading{&book_.statistics(), param_id};
    mu_.Await(absl::Condition(
        +[](Reading* r) { return !r->statistics->reading(r->param); }, &reading));
    OPTSTEP_RETURN_IF_ERROR(book_.CheckFresh(c));  // so c.generation is the book's now
    OPTSTEP_RETURN_IF_ERROR(
        book_.contributions().AddRange(c.trainer, param_id, offset, count, &fresh));
    // Recorded with the ranges, so that a commit that sees them sees the digests too.
    if (fresh.size() == 1 && fresh[0] == ElementRange{offset, offset + count}) {
      book_.contributions().AddDigests(c.trainer, digest, digest);
    } else {
      // A resend over elements an earlier attempt summed (REPLICATED): rare, and a chunk's worth.
      ContributionDigest written;
      for (const ElementRange& range : fresh) {
        written.Add(param_id, dtype, range.begin,
                    SliceBytes(pieces, (range.begin - offset) * size, (range.end - offset) * size));
      }
      book_.contributions().AddDigests(c.trainer, digest, written);
    }
    book_.statistics().BeginWrite(param_id, !fresh.empty());
    ++inflight_copies_;
    ++inflight_of_[c.trainer];
  }
  // Trainer 0 (and SHARDED) writes the buffer; later trainers add to it, in turn.
  const bool add = ordered_ && c.trainer > 0;
  absl::Status status;
  int64_t written = 0;
  for (const ElementRange& range : fresh) {
    status = CopyPiecesFromHost(
        replica_->device(),
        SliceBytes(pieces, (range.begin - offset) * size, (range.end - offset) * size), dtype, add,
        replica_->grad(param_id), range.begin);
    if (!status.ok()) break;
    written += range.end - range.begin;
  }
  std::vector<WaitingChunk> released;
  {
    absl::MutexLock lock(&mu_);
    if (c.generation == book_.generation()) {
      // Posted before the last copy is counted out, so before the resolution's device work.
      const std::optional<uint64_t> version = book_.statistics().EndWrite(
          param_id, status.ok() && book_.contributions().complete(param_id));
      if (version) PostStatisticsLocked(param_id, *version);
    }
    --inflight_copies_;
    --inflight_of_[c.trainer];
    if (!status.ok()) {
      // Recorded but not (all) written: the step cannot be trusted on this rank any more.
      book_.MarkBroken();
      gate_.Stop();
      status = absl::InternalError(
          absl::StrCat("session '", id_, "': param '", replica_->names()[param_id],
                       "': writing the gradient failed: ", status.message()));
    } else if (ordered_ && c.generation == book_.generation() &&
               c.trainer == book_.order().turn(param_id)) {
      released = book_.order().Added(param_id, written);
    }
  }
  if (status.ok()) observer_->OnBytesIn(static_cast<int64_t>(written * size));
  // Adding a released chunk can release the next trainer's, and so on: they are added one after
  // another rather than from within each other (up to 4096 trainers deep on the stack).
  for (WaitingChunk& chunk : released) {
    RunFlat([self = shared_from_this(), chunk = std::move(chunk)] {
      chunk.added(
          self->WriteChunk(chunk.handle, chunk.param, chunk.offset, chunk.dtype, chunk.pieces));
    });
  }
  return status;
}

void Session::PostStatisticsLocked(int param, uint64_t version) {
  const uint64_t generation = book_.generation();
  coordinator_->PostDevice(absl::StrCat("step ", book_.counters().step + 1,
                                        " gradient statistics of '", replica_->names()[param], "'"),
                           [weak = weak_from_this(), param, generation, version] {
                             std::shared_ptr<Session> self = weak.lock();
                             if (self != nullptr)
                               self->ComputeStatistics(param, generation, version);
                           });
}

void Session::ComputeStatistics(int param, uint64_t generation, uint64_t version) {
  {
    absl::MutexLock lock(&mu_);
    if (generation != book_.generation() || !book_.statistics().Claim(param, version)) return;
  }
  GradientStatistics::Result stats =
      MeanAndStatistics(replica_->config(), replica_->device(), replica_->grad(param));
  absl::MutexLock lock(&mu_);
  book_.statistics().Release(param, version, generation == book_.generation(), std::move(stats));
}

absl::Status Session::Commit(const StepHandle& c, uint64_t num_elements, StepCallback done) {
  std::optional<StepOutcome> replay;
  std::vector<StepCallback> superseded;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(book_.CheckFresh(c));
    // A retry whose step was applied before this commit: answered as a replay of that step.
    StepHandle handle = c;
    handle.replay = c.replay || book_.AppliedSinceRetry(c);
    if (handle.replay || handle.retry) OPTSTEP_RETURN_IF_ERROR(book_.CheckResent(handle));
    if (handle.replay) {
      replay = book_.last_outcome();
    } else {
      // The streams this retry replaces end: the trainer waits on this one (each stream it left
      // open would hold its slot and window until the step resolves).
      if (c.retry) superseded = book_.TakeWaitersOf(c.trainer);
      OPTSTEP_RETURN_IF_ERROR(book_.Commit(c, num_elements, std::move(done)));
      StartResolutionLocked(ResolutionKind::kApply);
    }
  }
  for (StepCallback& told : superseded) {
    told(absl::AbortedError(absl::StrCat("session '", id_, "': step ", c.step, " of trainer ",
                                         c.trainer,
                                         ": a newer stream of the trainer waits for "
                                         "the step in this one's place")));
  }
  if (!replay) return absl::OkStatus();
  // Replay of the last applied step: its result with the current parameters.
  if (!c.return_params) {
    replay->params = nullptr;
    done(*replay);
    return absl::OkStatus();
  }
  GetSnapshot(c.return_dtype, [outcome = *replay, done = std::move(done)](
                                  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) mutable {
    if (!s.ok()) return done(s.status());
    outcome.params = *std::move(s);
    done(std::move(outcome));
  });
  return absl::OkStatus();
}

void Session::GetSnapshot(DType dtype, SnapshotCallback done) {
  std::shared_ptr<const ParamSnapshot> published;
  {
    absl::MutexLock lock(&mu_);
    published = PublishedLocked(dtype);
  }
  if (published != nullptr) return done(std::move(published));
  // Read on the coordinator, which alone writes the masters: the values are those of one step.
  coordinator_->Post([self = shared_from_this(), dtype, done = std::move(done)] {
    uint64_t step = 0;
    std::shared_ptr<const ParamSnapshot> published;
    absl::Status refused;
    {
      absl::MutexLock lock(&self->mu_);
      step = self->book_.counters().step;
      // A step that resolved before this task (ReleaseSnapshots) may have published its own.
      published = self->PublishedLocked(dtype);
      if (published == nullptr) refused = self->CheckMastersAtStepLocked(step);
    }
    if (published != nullptr) return done(std::move(published));
    if (!refused.ok()) return done(refused);
    absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot =
        self->coordinator_->BuildSnapshot(dtype, step);
    if (snapshot.ok()) {
      {
        absl::MutexLock lock(&self->mu_);
        if (self->book_.counters().step == step) self->book_.snapshots()[dtype] = *snapshot;
      }
      self->retention_.Track(*snapshot);
    }
    done(std::move(snapshot));
  });
}

std::shared_ptr<const ParamSnapshot> Session::PublishedLocked(DType dtype) {
  auto it = book_.snapshots().find(dtype);
  return it == book_.snapshots().end() ? nullptr : it->second;
}

absl::Status Session::CheckMastersAtStepLocked(uint64_t step) const {
  // Steps that failed part way (broken), were interrupted after this rank's update (the redo
  // skips it) or healed in a peer's update leave masters that are not those of `step`.
  if (book_.broken()) return book_.CheckUsable();
  if (masters_ahead_to_.has_value() && *masters_ahead_to_ > step) {
    return absl::UnavailableError(
        absl::StrCat("session '", id_, "': rank ", rank(), " healed with a peer's masters of step ",
                     *masters_ahead_to_,
                     ", which a lost rank interrupted; its state is read again once the "
                     "step is taken again"));
  }
  if (replica_->owned_applied_step() <= step) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "session '", id_, "': rank ", rank(), " stepped its parameters in step ", step + 1,
      ", which a lost peer interrupted; its state is read again once the step is taken again"));
}

// --- Ending steps ---

bool Session::StartResolutionLocked(ResolutionKind kind) {
  if (HealPausedLocked()) return false;  // ResumeAfterHeal starts it
  if (kind == ResolutionKind::kApply && !book_.ready_to_apply()) return false;
  if (!gate_.TryStart()) return false;  // deferred until the hold ends or rises
  book_.set_running(true);
  coordinator_->Post([self = shared_from_this(), kind] {
    self->coordinator_->Resolve(kind);
    self->gate_.Finish();
  });
  return true;
}

void Session::AbortIfExpired(absl::Time now) {
  uint64_t resolution = 0, step = 0;
  {
    absl::MutexLock lock(&mu_);
    const std::optional<absl::Time>& began = book_.step_began();
    if (book_.running() || !book_.CheckUsable().ok() || !began || now - *began < step_deadline_ ||
        !gate_.may_start()) {
      return;
    }
    int64_t dropped = 0;  // a tenant's trainers may leave step after step incomplete
    LOG_IF(WARNING, CallerLogBudget().Take(&dropped))
        << "session " << id_ << " rank " << rank() << ": step " << book_.counters().step + 1
        << " incomplete after " << absl::FormatDuration(step_deadline_) << "; voting to abort"
        << DroppedBefore(dropped);
    StartResolutionLocked(ResolutionKind::kAbort);  // no further contributions count
    resolution = gate_.started();
    step = book_.counters().step + 1;
  }
  if (on_abort_vote_ && layout().world_size > 1) on_abort_vote_(resolution, step);
}

void Session::JoinAbort(uint64_t resolution, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (!book_.CheckUsable().ok() || gate_.started() + 1 != resolution ||
      step != book_.counters().step + 1) {
    return;
  }
  int64_t dropped = 0;
  LOG_IF(WARNING, CallerLogBudget().Take(&dropped))
      << "session " << id_ << " rank " << rank() << ": another rank voted to abort step " << step
      << "; joining the vote" << DroppedBefore(dropped);
  StartResolutionLocked(ResolutionKind::kAbort);
}

void Session::Close() {
  std::vector<StepCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (!book_.Close()) return;  // closed before
    gate_.Stop();
    if (!book_.running()) callbacks = book_.Abort();
  }
  coordinator_->CancelDeviceWork();
  const absl::Status reason =
      absl::UnavailableError(absl::StrCat("session '", id_, "' closed before the step ran"));
  for (StepCallback& done : callbacks) done(reason);
}

bool Session::step_pending() const {
  absl::MutexLock lock(&mu_);
  return book_.step_began().has_value();
}

absl::Status Session::AdoptResolutions(uint64_t resolutions) {
  absl::MutexLock lock(&mu_);
  if (book_.step_began().has_value() || book_.running()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "' rank ", rank(), ": a step began before the heal adopted the group's ",
        resolutions, " resolutions"));
  }
  return gate_.Adopt(resolutions);
}

void Session::RebaseResolutions(uint64_t resolutions) {
  absl::MutexLock lock(&mu_);
  gate_.Rebase(resolutions);
}

bool Session::healthy() const { return health().healthy(); }

// --- StepLedger ---

StepLedger::Pending Session::BeginResolution() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* inflight) { return *inflight == 0; }, &inflight_copies_));
  return book_.pending();
}

std::vector<std::optional<GradientStatistics::Result>> Session::IngestStatistics() {
  absl::MutexLock lock(&mu_);
  return book_.statistics().Current();
}

std::vector<StepWaiter> Session::TakeStreamingWaiters() {
  absl::MutexLock lock(&mu_);
  return book_.TakeStreamingWaiters();
}

void Session::ReleaseSnapshots() {
  std::map<DType, std::shared_ptr<const ParamSnapshot>> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(book_.snapshots());
  }
  // Dropped here, outside the lock: freed, or back to the pool they came from, unless a stream
  // still sends from one.
}

void Session::MarkBroken() {
  absl::MutexLock lock(&mu_);
  book_.MarkBroken();
  gate_.Stop();
}

StepLedger::Ended Session::EndStep(absl::StatusOr<StepOutcome>& outcome) {
  Ended ended;
  std::vector<WaitingChunk> stranded;  // none when every trainer committed
  {
    absl::MutexLock lock(&mu_);
    ended = book_.EndStep(outcome, &stranded);
  }
  for (WaitingChunk& chunk : stranded) {
    chunk.added(
        absl::AbortedError(absl::StrCat("step ", ended.step, " ended before the chunk's turn")));
  }
  return ended;
}

void Session::EndResolution(
    const std::map<DType, std::shared_ptr<const ParamSnapshot>>* snapshots) {
  std::map<DType, std::shared_ptr<const ParamSnapshot>> replaced;  // dropped after the lock
  absl::MutexLock lock(&mu_);
  if (snapshots != nullptr) {
    replaced.swap(book_.snapshots());
    book_.snapshots() = *snapshots;
  }
  book_.set_running(false);
}

}  // namespace optstep
