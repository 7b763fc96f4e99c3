#include "server/engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "glog/logging.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"

namespace optstep {
namespace {

std::vector<int64_t> NumelsOf(const std::vector<ParamInfo>& params) {
  std::vector<int64_t> numels;
  for (const ParamInfo& p : params) numels.push_back(p.numel());
  return numels;
}

std::vector<int64_t> OwnedNumels(const std::vector<int64_t>& numels, const Layout& layout,
                                 int rank) {
  std::vector<int64_t> owned(numels.size(), 0);
  for (size_t p = 0; p < numels.size(); ++p) {
    if (layout.owner[p] == rank) owned[p] = numels[p];
  }
  return owned;
}

std::vector<std::string> NamesOf(const std::vector<ParamInfo>& params) {
  std::vector<std::string> names;
  for (const ParamInfo& p : params) names.push_back(p.name);
  return names;
}

}  // namespace

Session::Session(Options options, std::shared_ptr<Device> device,
                 std::shared_ptr<SerialExecutor> worker)
    : id_(std::move(options.id)),
      config_(std::move(options.config)),
      layout_(std::move(options.layout)),
      rank_(options.rank),
      step_deadline_(options.step_deadline),
      max_bytes_(options.max_bytes),
      device_(std::move(device)),
      worker_(std::move(worker)),
      observer_(options.observer ? std::move(options.observer)
                                 : std::make_shared<StepObserver>()),
      on_abort_vote_(std::move(options.on_abort_vote)),
      names_(NamesOf(config_.params)),
      numels_(NumelsOf(config_.params)),
      comm_(std::move(options.comm)),
      coordinator_(std::make_unique<SerialExecutor>()),
      // Coverage is checked for the parameters this rank owns (others count as empty).
      ordered_(config_.mode == GradientMode::kReplicated && config_.num_trainers > 1),
      contributions_(config_.mode, config_.num_trainers, OwnedNumels(numels_, layout_, rank_),
                     &names_),
      order_(config_.num_trainers, OwnedNumels(numels_, layout_, rank_)) {
  attempts_.assign(config_.num_trainers, 0);
}

Session::~Session() {
  // Tasks hold the session alive, so none is pending here; finish the coordinator first.
  coordinator_.reset();
}

absl::Status Session::OnDevice(const std::function<absl::Status()>& task) {
  absl::Notification done;
  absl::Status status;
  worker_->Post([&] {
    status = task();
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

absl::StatusOr<std::shared_ptr<Session>> Session::Create(Options options,
                                                         std::shared_ptr<Device> device,
                                                         std::shared_ptr<SerialExecutor> worker) {
  std::shared_ptr<Session> session(
      new Session(std::move(options), std::move(device), std::move(worker)));
  OPTSTEP_RETURN_IF_ERROR(session->Allocate());
  return session;
}

absl::Status Session::Allocate() {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> defs,
                           RouteParameters(config_.chain, config_.params));
  group_of_.assign(config_.params.size(), 0);
  for (ParamGroup& def : defs) {
    const SubOptimizerConfig& sub = config_.chain.sub_optimizers[def.sub_optimizer];
    GroupRuntime group;
    OPTSTEP_ASSIGN_OR_RETURN(
        group.optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", def.id, ")"), sub,
                        def.overrides));
    for (int p : def.param_ids) {
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->CheckParam(config_.params[p]));
      group_of_[p] = def.id;
    }
    group.def = std::move(def);
    groups_.push_back(std::move(group));
  }

  // Every rank holds every master (they are all-gathered); only owned parameters need state and
  // a gradient buffer (one, whatever the number of trainers).
  int64_t total = 0;
  for (const ParamInfo& p : config_.params) {
    total += p.numel() * 4;
    if (layout_.owner[&p - config_.params.data()] == rank_) total += p.numel() * 4;
  }
  if (max_bytes_ > 0 && total > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes of parameters and gradients; the limit "
                                                     "is ", max_bytes_, " bytes per session"));
  }
  states_.resize(config_.params.size());
  OPTSTEP_RETURN_IF_ERROR(AllocateMasters());
  for (size_t p = 0; p < config_.params.size(); ++p) {
    const ParamInfo& info = config_.params[p];
    const bool owned = layout_.owner[p] == rank_;
    if (owned) owned_.push_back(static_cast<int>(p));
    Tensor grad;
    if (owned) {
      OPTSTEP_ASSIGN_OR_RETURN(grad, device_->Allocate(DType::kF32, info.shape));
      OPTSTEP_RETURN_IF_ERROR(groups_[group_of_[p]].optimizer->InitState(*device_, info, states_[p]));
      total += states_[p].bytes();
    }
    grads_.push_back(std::move(grad));
  }
  if (max_bytes_ > 0 && total > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes with optimizer state; the limit is ",
                                                     max_bytes_, " bytes per session"));
  }
  return absl::OkStatus();
}

absl::Status Session::AllocateMasters() {
  const int world = layout_.world_size;
  if (comm_ == nullptr || comm_->world_size() != world || comm_->rank() != rank_) {
    return absl::InternalError(absl::StrCat("session '", id_, "': communicator does not match rank ",
                                            rank_, " of ", world));
  }
  rank_counts_.assign(world, 0);
  for (size_t p = 0; p < numels_.size(); ++p) rank_counts_[layout_.owner[p]] += numels_[p];
  rank_offsets_.assign(world, 0);
  for (int r = 1; r < world; ++r) rank_offsets_[r] = rank_offsets_[r - 1] + rank_counts_[r - 1];
  const int64_t total = rank_offsets_[world - 1] + rank_counts_[world - 1];
  OPTSTEP_ASSIGN_OR_RETURN(masters_, device_->Allocate(DType::kF32, {total}));
  if (world > 1) {
    // Agree's votes: a float64 per parameter and three more, as fp32 words.
    const int64_t words = (static_cast<int64_t>(numels_.size()) + 3) * 2;
    OPTSTEP_ASSIGN_OR_RETURN(votes_, device_->Allocate(DType::kF32, {words}));
  }
  std::vector<int64_t> next = rank_offsets_;
  for (size_t p = 0; p < numels_.size(); ++p) {
    int64_t& offset = next[layout_.owner[p]];
    params_.emplace_back(DType::kF32, config_.params[p].shape, masters_.f32() + offset,
                         Tensor::Deleter());
    offset += numels_[p];
  }
  return absl::OkStatus();
}

SessionStats Session::stats() const {
  SessionStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats.step = step_;
    stats.skipped_steps = skipped_steps_;
  }
  for (const Tensor& t : params_) stats.param_bytes += t.bytes();
  for (const ParamState& s : states_) stats.state_bytes += s.bytes();
  for (const Tensor& t : grads_) stats.buffer_bytes += t.bytes();
  return stats;
}

absl::StatusOr<std::vector<std::pair<double, double>>> Session::ResolveSchedule(
    const StepBegin& begin) const {
  std::vector<std::pair<double, double>> schedule;
  for (const GroupRuntime& g : groups_) {
    schedule.emplace_back(g.optimizer->default_lr(), g.optimizer->default_weight_decay());
  }
  for (const auto& [group, values] : begin.schedules) {
    if (group < 0 || group >= static_cast<int>(groups_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("step ", begin.step, ": unknown group ", group,
                                                     " (session has ", groups_.size(), " groups)"));
    }
    const int id = group;
    auto check = [&](const char* name, const std::optional<double>& value,
                     double& slot) -> absl::Status {
      if (!value) return absl::OkStatus();
      if (!std::isfinite(*value) || *value < 0) {
        return absl::InvalidArgumentError(absl::StrCat("step ", begin.step, ": group ", id, ": ",
                                                       name, " = ", *value,
                                                       " must be finite and >= 0"));
      }
      slot = *value;
      return absl::OkStatus();
    };
    OPTSTEP_RETURN_IF_ERROR(check("lr", values.lr, schedule[id].first));
    OPTSTEP_RETURN_IF_ERROR(check("weight_decay", values.weight_decay, schedule[id].second));
  }
  return schedule;
}

absl::Status Session::InitValues(int param_id, int64_t offset, DType dtype, const void* data,
                                 size_t bytes) {
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t count, ElementCount(param_id, dtype, bytes));
  const std::string& name = names_[param_id];
  if (offset < 0 || count > numels_[param_id] - offset) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "': values [", offset, ", ",
                                                   offset + count, ") exceed ", numels_[param_id],
                                                   " elements"));
  }
  absl::MutexLock lock(&mu_);
  if (step_ > 0 || running_ || contributions_.started()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "': initial values can only be set before the first step (at step ",
        step_, ")"));
  }
  snapshots_.clear();
  return device_->CopyFromHost(data, dtype, count, params_[param_id], offset);
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
      step = self->step_;
    }
    absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot;
    absl::Status status = self->OnDevice([&] {
      snapshot = self->BuildSnapshot(dtype, step);
      return snapshot.status();
    });
    if (status.ok()) {
      absl::MutexLock lock(&self->mu_);
      if (self->step_ == step) self->snapshots_[dtype] = *snapshot;
    }
    done(std::move(snapshot));
  });
}

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> Session::BuildSnapshot(DType dtype,
                                                                           uint64_t step) {
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->step = step;
  snapshot->dtype = dtype;
  snapshot->values.resize(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) {
    std::string& bytes = snapshot->values[p];
    bytes.resize(params_[p].numel() * DTypeSize(dtype));
    OPTSTEP_RETURN_IF_ERROR(
        device_->CopyToHost(params_[p], 0, params_[p].numel(), dtype, bytes.data()));
  }
  return std::shared_ptr<const ParamSnapshot>(std::move(snapshot));
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
  for (Waiter& w : waiters_) callbacks.push_back(std::move(w.done));
  waiters_.clear();
  return callbacks;
}

void Session::AbortIfExpired(absl::Time now) {
  uint64_t resolution = 0, step = 0;
  {
    absl::MutexLock lock(&mu_);
    if (running_ || closed_ || broken_ || !step_began_ || now - *step_began_ < step_deadline_ ||
        !MayStartResolutionLocked()) {
      return;
    }
    LOG(WARNING) << "session " << id_ << " rank " << rank_ << ": step " << step_ + 1
                 << " incomplete after " << absl::FormatDuration(step_deadline_)
                 << "; voting to abort";
    StartResolutionLocked(/*abort=*/true);  // no further contributions count for this step
    resolution = resolutions_started_;
    step = step_ + 1;
  }
  if (on_abort_vote_ && layout_.world_size > 1) on_abort_vote_(resolution, step);
}

void Session::JoinAbort(uint64_t resolution, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (closed_ || broken_ || resolutions_started_ + 1 != resolution || step != step_ + 1) return;
  LOG(WARNING) << "session " << id_ << " rank " << rank_ << ": another rank voted to abort step "
               << step << "; joining the vote";
  StartResolutionLocked(/*abort=*/true);
}

void Session::Close() {
  std::vector<StepCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
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

void Session::RunStep(bool abort) {
  std::vector<std::pair<double, double>> schedule;
  std::optional<absl::Time> began;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* inflight) { return *inflight == 0; }, &inflight_copies_));
    if (schedule_) schedule = *schedule_;
    began = step_began_;
  }
  const absl::Time started = absl::Now();
  if (!abort && began) observer_->OnPhase(StepObserver::Phase::kIngest, started - *began);
  // 1-2. This rank's part: the REPLICATED mean (the sum is already in trainer order), per-parameter
  // sums of squares and finiteness of the parameters it owns.
  std::vector<double> sums(numels_.size(), 0.0);
  bool finite = true;
  absl::Status local = absl::OkStatus();
  if (!abort) {
    local = OnDevice([&]() -> absl::Status {
      const int n = config_.num_trainers;
      for (int p : owned_) {
        if (ordered_) {
          OPTSTEP_RETURN_IF_ERROR(device_->Scale(1.0f / static_cast<float>(n), grads_[p]));
        }
        OPTSTEP_ASSIGN_OR_RETURN(GradientStats stats, device_->ComputeGradientStats(grads_[p]));
        finite = finite && stats.all_finite;
        sums[p] = stats.sum_squares;
      }
      return absl::OkStatus();
    });
  }
  // A rank that cannot compute its part still votes (to abort), so that every rank aborts with
  // it and none waits for it in the collective.
  if (!local.ok()) {
    LOG(ERROR) << "session " << id_ << " rank " << rank_ << ": gradient statistics failed: "
               << local;
  }
  // 3. Agree with the other ranks; the global norm.
  absl::StatusOr<Agreement> agreement = Agree(abort, !local.ok(), sums, finite);
  if (!agreement.ok()) {
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    LOG(ERROR) << "session " << id_ << " rank " << rank_ << ": lost the group: "
               << agreement.status();
    return FinishStep(absl::UnavailableError(absl::StrCat(
                          "session '", id_, "': rank ", rank_, " lost a peer during step ",
                          "agreement: ", agreement.status().message())),
                      /*aborted=*/false);
  }
  if (agreement->failed) {
    return FinishStep(absl::AbortedError(absl::StrCat(
                          "session '", id_, "': step aborted: a rank could not compute its gradient "
                          "statistics (see the ranks' logs", local.ok() ? "" : "; here: ",
                          local.message(), "); redo the step")),
                      /*aborted=*/true);
  }
  if (agreement->abort) {
    return FinishStep(absl::AbortedError(absl::StrCat(
                          "session '", id_, "': step aborted: contributions incomplete on some rank "
                          "after the ", absl::FormatDuration(step_deadline_),
                          " step deadline; redo the step")),
                      /*aborted=*/true);
  }
  StepOutcome outcome;
  outcome.skipped = agreement->skipped;
  outcome.grad_norm = agreement->grad_norm;
  if (!outcome.skipped) {
    if (schedule.empty()) {
      auto defaults = ResolveSchedule(StepBegin{});
      schedule = *defaults;
    }
    // The result is known now: the trainers get it, and each parameter as soon as it is ready.
    const double clip = config_.chain.clip_grad;
    outcome.clipped = clip > 0.0 && clip / (agreement->grad_norm + 1e-6) < 1.0;
    const StreamingSnapshots streaming = StreamEarly(outcome);
    std::vector<int> last_ids;
    absl::Status applied = ApplyStep(schedule, *agreement, outcome, started, streaming, &last_ids);
    if (!applied.ok()) {
      // Part of the state may be stepped, a peer may be lost in the all-gather, or the other
      // ranks may wait in it: this replica cannot be trusted any more.
      {
        absl::MutexLock lock(&mu_);
        broken_ = true;
      }
      for (const auto& entry : streaming) entry.second->readiness->Fail(applied);
      return FinishStep(applied, /*aborted=*/false);
    }
    return FinishStep(std::move(outcome), /*aborted=*/false, streaming, last_ids);
  }
  FinishStep(std::move(outcome), /*aborted=*/false);
}

Session::StreamingSnapshots Session::StreamEarly(const StepOutcome& outcome) {
  std::vector<Waiter> early;
  uint64_t step = 0;
  {
    absl::MutexLock lock(&mu_);
    step = step_ + 1;
    auto wants = std::stable_partition(waiters_.begin(), waiters_.end(),
                                       [](const Waiter& w) { return !(w.want_params && w.stream); });
    early.assign(std::make_move_iterator(wants), std::make_move_iterator(waiters_.end()));
    waiters_.erase(wants, waiters_.end());
  }
  StreamingSnapshots streaming;
  for (const Waiter& w : early) {
    std::shared_ptr<ParamSnapshot>& snapshot = streaming[w.dtype];
    if (snapshot != nullptr) continue;
    snapshot = std::make_shared<ParamSnapshot>();
    snapshot->step = step;
    snapshot->dtype = w.dtype;
    snapshot->values.resize(numels_.size());
    for (size_t p = 0; p < numels_.size(); ++p) {
      snapshot->values[p].resize(numels_[p] * DTypeSize(w.dtype));
    }
    snapshot->readiness = std::make_shared<ParamReadiness>();
  }
  for (Waiter& w : early) {
    StepOutcome mine = outcome;
    mine.step = step;
    mine.params = streaming[w.dtype];
    w.done(std::move(mine));
  }
  return streaming;
}

absl::Status Session::PublishParams(const std::vector<int>& ids,
                                    const StreamingSnapshots& streaming, bool mark) {
  for (const auto& [dtype, snapshot] : streaming) {
    for (int p : ids) {
      OPTSTEP_RETURN_IF_ERROR(
          device_->CopyToHost(params_[p], 0, params_[p].numel(), dtype, snapshot->values[p].data()));
    }
    if (mark) snapshot->readiness->MarkReady(ids);
  }
  return absl::OkStatus();
}

absl::StatusOr<Session::Agreement> Session::Agree(bool abort, bool failed,
                                                  const std::vector<double>& sums, bool finite) {
  // One all-reduce carries every parameter's sum of squares (only its owner contributes a
  // non-zero value, so the sum is exact), the non-finite, abort and failure votes.
  const size_t n = sums.size();
  std::vector<double> votes(sums);
  votes.push_back(finite ? 0.0 : 1.0);
  votes.push_back(abort ? 1.0 : 0.0);
  votes.push_back(failed ? 1.0 : 0.0);
  if (layout_.world_size > 1) {
    // Collectives move the device's memory (NCCL: the GPU's): the votes go through votes_, as
    // raw fp32 words (a bit copy both ways).
    const int64_t words = static_cast<int64_t>(votes.size()) * 2;
    OPTSTEP_RETURN_IF_ERROR(device_->CopyFromHost(votes.data(), DType::kF32, words, votes_, 0));
    OPTSTEP_RETURN_IF_ERROR(comm_->AllReduce(votes_.data(), static_cast<int64_t>(votes.size()),
                                             CommDType::kFloat64, ReduceOp::kSum));
    OPTSTEP_RETURN_IF_ERROR(device_->CopyToHost(votes_, 0, words, DType::kF32, votes.data()));
  }
  Agreement agreement;
  agreement.abort = votes[n + 1] > 0.0;
  agreement.failed = votes[n + 2] > 0.0;
  agreement.skipped = votes[n] > 0.0;
  if (!agreement.abort && !agreement.failed && !agreement.skipped) {
    double total = 0.0;
    for (size_t p = 0; p < n; ++p) total += votes[p];  // parameter order, on every rank
    agreement.grad_norm = std::sqrt(total);
  }
  return agreement;
}

absl::Status Session::ApplyStep(const std::vector<std::pair<double, double>>& schedule,
                                const Agreement& agreement, StepOutcome& outcome,
                                absl::Time started, const StreamingSnapshots& streaming,
                                std::vector<int>* last_ids) {
  OPTSTEP_RETURN_IF_ERROR(OnDevice([&]() -> absl::Status {
    // 4. Clip: c = clip / (norm + 1e-6), applied only when c < 1.
    const double clip = config_.chain.clip_grad;
    if (clip > 0.0) {
      const double coef = clip / (agreement.grad_norm + 1e-6);
      if (coef < 1.0) {
        outcome.clipped = true;
        for (int p : owned_) {
          OPTSTEP_RETURN_IF_ERROR(device_->Scale(static_cast<float>(coef), grads_[p]));
        }
      }
    }
    // 5. Each group steps the parameters this rank owns; every rank advances every group's
    // counter, so they agree. Every kStreamBucketBytes of stepped parameters go out to the
    // streaming snapshots while the next bucket steps.
    constexpr int64_t kStreamBucketBytes = 16 << 20;
    std::vector<int> bucket;
    int64_t bucket_bytes = 0;
    auto publish = [&]() -> absl::Status {
      if (bucket.empty()) return absl::OkStatus();
      OPTSTEP_RETURN_IF_ERROR(device_->Synchronize());
      OPTSTEP_RETURN_IF_ERROR(PublishParams(bucket, streaming));
      bucket.clear();
      bucket_bytes = 0;
      return absl::OkStatus();
    };
    for (GroupRuntime& group : groups_) {
      StepArgs args;
      args.lr = schedule[group.def.id].first;
      args.weight_decay = schedule[group.def.id].second * group.def.wd_mult;
      args.group_step = static_cast<int64_t>(group.applied_steps) + 1;
      for (int p : group.def.param_ids) {
        if (layout_.owner[p] != rank_) continue;
        OPTSTEP_RETURN_IF_ERROR(
            group.optimizer->Step(*device_, args, grads_[p], params_[p], states_[p]));
        if (streaming.empty()) continue;
        bucket.push_back(p);
        bucket_bytes += numels_[p] * 4;
        if (bucket_bytes >= kStreamBucketBytes) OPTSTEP_RETURN_IF_ERROR(publish());
      }
      ++group.applied_steps;
    }
    // The last bucket (and the gathered parameters) is marked ready by FinishStep.
    *last_ids = bucket;
    OPTSTEP_RETURN_IF_ERROR(device_->Synchronize());
    return PublishParams(bucket, streaming, /*mark=*/false);
  }));
  const absl::Time gather_started = absl::Now();
  observer_->OnPhase(StepObserver::Phase::kStep, gather_started - started);
  // 6. Every rank gets every updated parameter: each rank's block of masters_ in place.
  if (layout_.world_size > 1) {
    absl::Status gathered = comm_->AllGatherV(masters_.f32() + rank_offsets_[rank_],
                                              rank_counts_[rank_], masters_.f32(), rank_counts_,
                                              CommDType::kFloat32);
    if (!gathered.ok()) {
      return absl::UnavailableError(absl::StrCat("session '", id_, "': rank ", rank_,
                                                 " lost a peer during the all-gather: ",
                                                 gathered.message()));
    }
    observer_->OnPhase(StepObserver::Phase::kAllGather, absl::Now() - gather_started);
  }
  std::vector<int> gathered;
  for (size_t p = 0; p < numels_.size(); ++p) {
    if (layout_.owner[p] != rank_) gathered.push_back(static_cast<int>(p));
  }
  if (!streaming.empty() && !gathered.empty()) {
    last_ids->insert(last_ids->end(), gathered.begin(), gathered.end());
    OPTSTEP_RETURN_IF_ERROR(
        OnDevice([&] { return PublishParams(gathered, streaming, /*mark=*/false); }));
  }
  return absl::OkStatus();
}

void Session::FinishStep(absl::StatusOr<StepOutcome> outcome, bool aborted,
                         const StreamingSnapshots& streamed, const std::vector<int>& last_ids) {
  std::vector<Waiter> waiters;
  std::vector<WaitingChunk> stranded;
  uint64_t ended_step = 0;
  {
    absl::MutexLock lock(&mu_);
    waiters = std::move(waiters_);
    waiters_.clear();
    if (outcome.ok()) {
      ++step_;
      if (outcome->skipped) ++skipped_steps_;
      outcome->step = step_;
      last_outcome_ = *outcome;
    }
    ended_step = outcome.ok() ? step_ : step_ + 1;
    stranded = ResetStepLocked();  // no chunk waits when every trainer committed
    snapshots_.clear();
  }
  for (WaitingChunk& chunk : stranded) {
    chunk.added(absl::AbortedError(absl::StrCat("step ", ended_step, " ended before the chunk's turn")));
  }
  // Serialise the parameters once per requested dtype, shared by every trainer.
  std::map<DType, std::shared_ptr<const ParamSnapshot>> snapshots(streamed.begin(), streamed.end());
  if (outcome.ok()) {
    const uint64_t step = outcome->step;
    absl::Status built = OnDevice([&]() -> absl::Status {
      for (const Waiter& w : waiters) {
        if (!w.want_params || snapshots.count(w.dtype) > 0) continue;
        OPTSTEP_ASSIGN_OR_RETURN(snapshots[w.dtype], BuildSnapshot(w.dtype, step));
      }
      return absl::OkStatus();
    });
    if (!built.ok()) outcome = built;
  }
  {
    absl::MutexLock lock(&mu_);
    if (outcome.ok()) snapshots_ = snapshots;
    running_ = false;
  }
  for (const auto& entry : streamed) {
    if (outcome.ok()) {
      entry.second->readiness->MarkReady(last_ids);
    } else {
      entry.second->readiness->Fail(outcome.status());
    }
  }
  if (!aborted && !outcome.ok()) {
    LOG(ERROR) << "session " << id_ << " rank " << rank_ << ": step failed: " << outcome.status();
  }
  using End = StepObserver::StepEnd;
  observer_->OnStepEnd(id_, ended_step, rank_,
                       aborted         ? End::kAborted
                       : !outcome.ok() ? End::kFailed
                       : outcome->skipped ? End::kSkipped
                                          : End::kApplied,
                       outcome.ok() ? "" : outcome.status().message());
  for (Waiter& w : waiters) {
    if (!outcome.ok()) {
      w.done(outcome.status());
      continue;
    }
    StepOutcome mine = *outcome;
    if (w.want_params) mine.params = snapshots[w.dtype];
    w.done(std::move(mine));
  }
}

}  // namespace optstep
