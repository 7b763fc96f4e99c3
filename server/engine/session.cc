#include "server/engine/session.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/finite_values.h"
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
      // Coverage is checked for the parameters this rank owns (others count as empty).
      contributions_(replica_->config().mode, replica_->config().num_trainers,
                     OwnedNumels(*replica_), &replica_->names()),
      order_(replica_->config().num_trainers, OwnedNumels(*replica_)) {
  attempts_.assign(replica_->config().num_trainers, 0);
}

Session::~Session() {
  // Tasks hold the session alive, so none is pending here; finish the coordinator first.
  coordinator_.reset();
}

absl::StatusOr<std::shared_ptr<Session>> Session::Create(Options options,
                                                         std::shared_ptr<Device> device,
                                                         std::shared_ptr<SerialExecutor> worker) {
  OPTSTEP_ASSIGN_OR_RETURN(
      std::unique_ptr<ReplicaState> replica,
      ReplicaState::Create(options.id, std::move(options.config), std::move(options.layout),
                           options.rank, options.max_bytes, std::move(device)));
  std::shared_ptr<Session> session(new Session(options, std::move(replica)));
  StepCoordinator::Options coordinator;
  coordinator.session_id = session->id_;
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
    stats.step = counters_.step;
    stats.skipped_steps = counters_.skipped_steps;
  }
  const ReplicaState::Bytes bytes = replica_->bytes();
  stats.param_bytes = bytes.params;
  stats.state_bytes = bytes.state;
  stats.buffer_bytes = bytes.buffers;
  return stats;
}

// --- Contributions ---

absl::StatusOr<Contribution> Session::Begin(const StepBegin& begin) {
  const int trainers = config().num_trainers;
  if (begin.trainer < 0 || begin.trainer >= trainers) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_id ", begin.trainer,
                                                   " out of range: session '", id_, "' declares ",
                                                   trainers, " trainers"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(StepSchedule schedule, ResolveSchedule(replica_->DefaultSchedule(),
                                                                  begin.step, begin.schedules));
  std::vector<WaitingChunk> superseded;
  Contribution c;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckUsable());
    c.trainer = begin.trainer;
    c.step = begin.step;
    c.return_dtype = begin.return_dtype;
    c.return_params = begin.return_params;
    c.stream_params = begin.stream_params;
    c.generation = generation_;
    const uint64_t step = counters_.step;
    if (begin.step == step && step > 0 && last_outcome_) {
      c.replay = true;
      return c;
    }
    if (begin.step != step + 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session '", id_, "': step ", begin.step, " out of sequence; expected step ", step + 1));
    }
    if (running_ || contributions_.committed(begin.trainer)) {
      c.retry = true;
      return c;
    }
    if (schedule_) {
      OPTSTEP_RETURN_IF_ERROR(CheckSameSchedule(begin.step, begin.trainer, schedule, *schedule_));
    }
    schedule_ = std::move(schedule);
    if (!step_began_) step_began_ = absl::Now();
    contributions_.DropTrainer(begin.trainer);
    superseded = order_.TakeWaiting(begin.trainer);
    c.attempt = ++attempts_[begin.trainer];
  }
  for (WaitingChunk& chunk : superseded) {
    chunk.added(absl::AbortedError(absl::StrCat("step ", begin.step, ": trainer ", begin.trainer,
                                                " began the step again on another stream")));
  }
  return c;
}

absl::Status Session::CheckUsable() const {
  if (closed_) return absl::UnavailableError(absl::StrCat("session '", id_, "' is closed"));
  if (broken_) {
    return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank(),
                                               " lost a peer; the group must be restarted"));
  }
  return absl::OkStatus();
}

absl::Status Session::CheckFresh(const Contribution& c) const {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  if (c.generation != generation_ || (!c.retry && !c.replay && c.attempt != attempts_[c.trainer])) {
    return absl::AbortedError(absl::StrCat("session '", id_, "': step ", c.step, " of trainer ",
                                           c.trainer, " was aborted or superseded; redo the step"));
  }
  return absl::OkStatus();
}

absl::Status Session::AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                  const void* data, size_t bytes) {
  const absl::string_view piece(static_cast<const char*>(data), bytes);
  return AddGradient(c, param_id, offset, dtype, absl::MakeConstSpan(&piece, 1));
}

absl::Status Session::AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
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

absl::StatusOr<Session::ChunkFate> Session::AddGradient(const Contribution& c, int param_id,
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
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    if (c.retry || c.replay) return ChunkFate::kAdded;  // already counted once
    OPTSTEP_RETURN_IF_ERROR(contributions_.CheckBounds(param_id, offset, count));
    if (ordered_ && c.trainer > order_.turn(param_id)) {
      order_.Wait(WaitingChunk{c, param_id, offset, dtype,
                               std::vector<absl::string_view>(pieces.begin(), pieces.end()),
                               std::move(keep), std::move(added)});
      return ChunkFate::kWaiting;
    }
  }
  // The turn only moves forward, so it is still this trainer's (or past it: a resend).
  OPTSTEP_RETURN_IF_ERROR(WriteChunk(c, param_id, offset, dtype, pieces));
  return ChunkFate::kAdded;
}

absl::Status Session::WriteChunk(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                 absl::Span<const absl::string_view> pieces) {
  const size_t size = DTypeSize(dtype);
  std::vector<ElementRange> fresh;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    OPTSTEP_RETURN_IF_ERROR(contributions_.AddRange(
        c.trainer, param_id, offset, static_cast<int64_t>(TotalBytes(pieces) / size), &fresh));
    generation = generation_;
    ++inflight_copies_;
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
    --inflight_copies_;
    if (!status.ok()) {
      // Recorded but not (all) written: the step cannot be trusted on this rank any more.
      MarkBrokenLocked();
      status = absl::InternalError(
          absl::StrCat("session '", id_, "': param '", replica_->names()[param_id],
                       "': writing the gradient failed: ", status.message()));
    } else if (ordered_ && generation == generation_ && c.trainer == order_.turn(param_id)) {
      released = order_.Added(param_id, written);
    }
  }
  if (status.ok()) observer_->OnBytesIn(static_cast<int64_t>(written * size));
  AddReleased(std::move(released));
  return status;
}

void Session::AddReleased(std::vector<WaitingChunk> chunks) {
  for (WaitingChunk& chunk : chunks) {
    chunk.added(
        WriteChunk(chunk.contribution, chunk.param, chunk.offset, chunk.dtype, chunk.pieces));
  }
}

absl::Status Session::Commit(const Contribution& c, uint64_t num_elements, StepCallback done) {
  std::optional<StepOutcome> replay;
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    if (c.replay) {
      replay = last_outcome_;
    } else {
      if (!c.retry) {
        const int64_t received = contributions_.elements_from(c.trainer);
        if (num_elements != 0 && static_cast<int64_t>(num_elements) != received) {
          contributions_.DropTrainer(c.trainer);
          return absl::InvalidArgumentError(absl::StrCat("step ", c.step, ": trainer ", c.trainer,
                                                         " commits ", num_elements,
                                                         " elements but sent ", received));
        }
        absl::Status complete = contributions_.CheckTrainerComplete(c.trainer);
        if (complete.ok()) {
          contributions_.Commit(c.trainer);
          if (contributions_.all_committed()) complete = contributions_.CheckAllComplete();
        }
        if (!complete.ok()) {
          contributions_.DropTrainer(c.trainer);
          return complete;
        }
      }
      waiters_.push_back(
          StepWaiter{c.return_dtype, c.return_params, std::move(done), c.stream_params});
      StartIfCompleteLocked();
      return absl::OkStatus();
    }
  }
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

absl::Status Session::InitValues(int param_id, int64_t offset, DType dtype, const void* data,
                                 size_t bytes) {
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t count,
                           replica_->ValueCount(param_id, offset, dtype, bytes));
  // A message with a non-finite value is refused whole: none of its values is written.
  OPTSTEP_RETURN_IF_ERROR(
      CheckFiniteValues(absl::StrCat("param '", replica_->names()[param_id], "'"), "initial value",
                        offset, dtype, data, count));
  absl::MutexLock lock(&mu_);
  if (counters_.step > 0 || running_ || contributions_.started()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "': initial values can only be set before the first step (at step ",
        counters_.step, ")"));
  }
  snapshots_.clear();
  return replica_->WriteValues(param_id, offset, dtype, data, count);
}

void Session::GetSnapshot(DType dtype, SnapshotCallback done) {
  std::shared_ptr<const ParamSnapshot> published;
  {
    absl::MutexLock lock(&mu_);
    auto it = snapshots_.find(dtype);
    if (it != snapshots_.end()) published = it->second;
  }
  if (published != nullptr) return done(std::move(published));
  // Read the masters on the coordinator, which alone writes them during a step, so the values
  // are those of one step.
  coordinator_->Post([self = shared_from_this(), dtype, done = std::move(done)] {
    uint64_t step;
    {
      absl::MutexLock lock(&self->mu_);
      step = self->counters_.step;
    }
    absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot;
    absl::Status status = self->coordinator_->OnDevice([&] {
      snapshot = BuildSnapshot(*self->replica_, dtype, step);
      return snapshot.status();
    });
    if (status.ok()) {
      absl::MutexLock lock(&self->mu_);
      if (self->counters_.step == step) self->snapshots_[dtype] = *snapshot;
    }
    done(std::move(snapshot));
  });
}

// --- Ending steps ---

void Session::WriteCountersLocked(const ResolvedState& resolved) {
  if (resolved.step) counters_.step = *resolved.step;
  if (resolved.skipped_steps) counters_.skipped_steps = *resolved.skipped_steps;
  snapshots_.clear();
  last_outcome_.reset();
  ++generation_;
}

std::vector<WaitingChunk> Session::ResetStepLocked() {
  ++generation_;
  contributions_.Reset();
  schedule_.reset();
  step_began_.reset();
  return order_.Reset();
}

std::vector<StepCallback> Session::AbortLocked() {
  std::vector<StepCallback> callbacks;
  for (WaitingChunk& chunk : ResetStepLocked()) {
    callbacks.push_back([added = std::move(chunk.added)](absl::StatusOr<StepOutcome> outcome) {
      added(outcome.status());  // only ever told why the step ended
    });
  }
  for (StepWaiter& w : waiters_) callbacks.push_back(std::move(w.done));
  waiters_.clear();
  return callbacks;
}

void Session::MarkBrokenLocked() {
  broken_ = true;
  gate_.Stop();
}

bool Session::StartResolutionLocked(ResolutionKind kind) {
  if (!gate_.TryStart()) return false;  // deferred until the hold ends or rises
  running_ = true;
  coordinator_->Post([self = shared_from_this(), kind] {
    self->coordinator_->Resolve(kind);
    self->gate_.Finish();
  });
  return true;
}

void Session::StartIfCompleteLocked() {
  if (!closed_ && !broken_ && !running_ && contributions_.all_committed()) {
    StartResolutionLocked(ResolutionKind::kApply);
  }
}

void Session::AbortIfExpired(absl::Time now) {
  uint64_t resolution = 0, step = 0;
  {
    absl::MutexLock lock(&mu_);
    if (running_ || closed_ || broken_ || !step_began_ || now - *step_began_ < step_deadline_ ||
        !gate_.may_start()) {
      return;
    }
    LOG(WARNING) << "session " << id_ << " rank " << rank() << ": step " << counters_.step + 1
                 << " incomplete after " << absl::FormatDuration(step_deadline_)
                 << "; voting to abort";
    StartResolutionLocked(ResolutionKind::kAbort);  // no further contributions count
    resolution = gate_.started();
    step = counters_.step + 1;
  }
  if (on_abort_vote_ && layout().world_size > 1) on_abort_vote_(resolution, step);
}

void Session::JoinAbort(uint64_t resolution, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (closed_ || broken_ || gate_.started() + 1 != resolution || step != counters_.step + 1) {
    return;
  }
  LOG(WARNING) << "session " << id_ << " rank " << rank() << ": another rank voted to abort step "
               << step << "; joining the vote";
  StartResolutionLocked(ResolutionKind::kAbort);
}

void Session::Close() {
  std::vector<StepCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    gate_.Stop();
    if (!running_) callbacks = AbortLocked();
  }
  const absl::Status reason =
      absl::UnavailableError(absl::StrCat("session '", id_, "' closed before the step ran"));
  for (StepCallback& done : callbacks) done(reason);
}

bool Session::step_pending() const {
  absl::MutexLock lock(&mu_);
  return step_began_.has_value();
}

bool Session::healthy() const {
  absl::MutexLock lock(&mu_);
  return !broken_;
}

// --- StepLedger ---

StepLedger::Pending Session::BeginResolution() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* inflight) { return *inflight == 0; }, &inflight_copies_));
  return Pending{counters_.step + 1, schedule_, step_began_};
}

std::vector<StepWaiter> Session::TakeStreamingWaiters() {
  absl::MutexLock lock(&mu_);
  auto wants = std::stable_partition(waiters_.begin(), waiters_.end(), [](const StepWaiter& w) {
    return !(w.want_params && w.stream);
  });
  std::vector<StepWaiter> early(std::make_move_iterator(wants),
                                std::make_move_iterator(waiters_.end()));
  waiters_.erase(wants, waiters_.end());
  return early;
}

void Session::MarkBroken() {
  absl::MutexLock lock(&mu_);
  MarkBrokenLocked();
}

StepLedger::Ended Session::EndStep(absl::StatusOr<StepOutcome>& outcome) {
  Ended ended;
  std::vector<WaitingChunk> stranded;
  {
    absl::MutexLock lock(&mu_);
    ended.waiters = std::move(waiters_);
    waiters_.clear();
    if (outcome.ok()) {
      ++counters_.step;
      if (outcome->skipped) ++counters_.skipped_steps;
      outcome->step = counters_.step;
      last_outcome_ = *outcome;
    }
    ended.step = outcome.ok() ? counters_.step : counters_.step + 1;
    stranded = ResetStepLocked();  // no chunk waits when every trainer committed
    snapshots_.clear();
  }
  for (WaitingChunk& chunk : stranded) {
    chunk.added(
        absl::AbortedError(absl::StrCat("step ", ended.step, " ended before the chunk's turn")));
  }
  return ended;
}

void Session::EndResolution(
    const std::map<DType, std::shared_ptr<const ParamSnapshot>>* snapshots) {
  absl::MutexLock lock(&mu_);
  if (snapshots != nullptr) snapshots_ = *snapshots;
  running_ = false;
}

}  // namespace optstep
