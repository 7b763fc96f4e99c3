#include "server/engine/session.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/status_macros.h"
#include "server/optim/registry.h"

namespace optstep {
namespace {

std::vector<int64_t> NumelsOf(const std::vector<ParamInfo>& params) {
  std::vector<int64_t> numels;
  for (const ParamInfo& p : params) numels.push_back(p.numel());
  return numels;
}

std::vector<std::string> NamesOf(const std::vector<ParamInfo>& params) {
  std::vector<std::string> names;
  for (const ParamInfo& p : params) names.push_back(p.name);
  return names;
}

}  // namespace

Session::Session(Options options, Device* device, DeviceWorker* worker)
    : id_(std::move(options.id)),
      config_(std::move(options.config)),
      layout_(std::move(options.layout)),
      rank_(options.rank),
      step_deadline_(options.step_deadline),
      max_bytes_(options.max_bytes),
      device_(device),
      worker_(worker),
      names_(NamesOf(config_.params)),
      numels_(NumelsOf(config_.params)),
      contributions_(config_.mode, config_.num_trainers, numels_, &names_) {
  attempts_.assign(config_.num_trainers, 0);
}

Session::~Session() = default;

absl::StatusOr<std::shared_ptr<Session>> Session::Create(Options options, Device* device,
                                                         DeviceWorker* worker) {
  std::shared_ptr<Session> session(new Session(std::move(options), device, worker));
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
  // gradient buffers.
  int64_t total = 0;
  for (const ParamInfo& p : config_.params) {
    total += p.numel() * 4;
    if (layout_.owner[&p - config_.params.data()] == rank_) {
      total += p.numel() * 4 * (config_.mode == GradientMode::kReplicated ? config_.num_trainers : 1);
    }
  }
  if (max_bytes_ > 0 && total > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes of parameters and gradients; the limit "
                                                     "is ", max_bytes_, " bytes per session"));
  }
  const int extra_trainers =
      config_.mode == GradientMode::kReplicated ? config_.num_trainers - 1 : 0;
  staging_.resize(extra_trainers);
  states_.resize(config_.params.size());
  for (size_t p = 0; p < config_.params.size(); ++p) {
    const ParamInfo& info = config_.params[p];
    OPTSTEP_ASSIGN_OR_RETURN(Tensor param, device_->Allocate(DType::kF32, info.shape));
    params_.push_back(std::move(param));
    const bool owned = layout_.owner[p] == rank_;
    Tensor grad;
    if (owned) {
      OPTSTEP_ASSIGN_OR_RETURN(grad, device_->Allocate(DType::kF32, info.shape));
      OPTSTEP_RETURN_IF_ERROR(groups_[group_of_[p]].optimizer->InitState(*device_, info, states_[p]));
      total += states_[p].bytes();
    }
    grads_.push_back(std::move(grad));
    for (int t = 0; t < extra_trainers; ++t) {
      Tensor staging;
      if (owned) {
        OPTSTEP_ASSIGN_OR_RETURN(staging, device_->Allocate(DType::kF32, info.shape));
      }
      staging_[t].push_back(std::move(staging));
    }
  }
  if (max_bytes_ > 0 && total > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes with optimizer state; the limit is ",
                                                     max_bytes_, " bytes per session"));
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
  for (const auto& trainer : staging_) {
    for (const Tensor& t : trainer) stats.buffer_bytes += t.bytes();
  }
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

absl::StatusOr<Contribution> Session::Begin(const StepBegin& begin) {
  if (begin.trainer < 0 || begin.trainer >= config_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_id ", begin.trainer,
                                                   " out of range: session '", id_, "' declares ",
                                                   config_.num_trainers, " trainers"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(auto schedule, ResolveSchedule(begin));
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError(absl::StrCat("session '", id_, "' is closed"));
  Contribution c;
  c.trainer = begin.trainer;
  c.step = begin.step;
  c.return_dtype = begin.return_dtype;
  c.return_params = begin.return_params;
  c.generation = generation_;
  if (begin.step == step_ && step_ > 0 && last_outcome_) {
    c.replay = true;
    return c;
  }
  if (begin.step != step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("session '", id_, "': step ", begin.step,
                                                      " out of sequence; expected step ", step_ + 1));
  }
  if (running_ || contributions_.committed(begin.trainer)) {
    c.retry = true;
    return c;
  }
  if (schedule_ && *schedule_ != schedule) {
    for (size_t g = 0; g < schedule.size(); ++g) {
      if ((*schedule_)[g] != schedule[g]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step ", begin.step, ": trainer ", begin.trainer, " gives group ", g, " lr ",
            schedule[g].first, ", weight_decay ", schedule[g].second,
            " but another trainer gave lr ", (*schedule_)[g].first, ", weight_decay ",
            (*schedule_)[g].second));
      }
    }
  }
  schedule_ = std::move(schedule);
  if (!step_began_) step_began_ = absl::Now();
  contributions_.DropTrainer(begin.trainer);
  c.attempt = ++attempts_[begin.trainer];
  return c;
}

absl::Status Session::CheckFresh(const Contribution& c) const {
  if (closed_) return absl::UnavailableError(absl::StrCat("session '", id_, "' is closed"));
  if (c.generation != generation_ || (!c.retry && !c.replay && c.attempt != attempts_[c.trainer])) {
    return absl::AbortedError(absl::StrCat("session '", id_, "': step ", c.step, " of trainer ",
                                           c.trainer,
                                           " was aborted or superseded; redo the step"));
  }
  return absl::OkStatus();
}

Tensor& Session::GradientTarget(int trainer, int param_id) {
  if (config_.mode == GradientMode::kReplicated && trainer > 0) return staging_[trainer - 1][param_id];
  return grads_[param_id];
}

absl::Status Session::AddGradient(const Contribution& c, int param_id, int64_t offset, DType dtype,
                                  const void* data, size_t bytes) {
  if (param_id < 0 || param_id >= static_cast<int>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", param_id, " not found: session '", id_,
                                            "' has ", params_.size(), " parameters"));
  }
  const std::string& name = names_[param_id];
  if (layout_.owner[param_id] != rank_) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "' is owned by rank ",
                                                   layout_.owner[param_id], ", not rank ", rank_));
  }
  const size_t size = DTypeSize(dtype);
  if (bytes % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "': ", bytes,
                                                   " bytes is not a multiple of the ",
                                                   DTypeName(dtype), " element size ", size));
  }
  const int64_t count = static_cast<int64_t>(bytes / size);
  {
    absl::MutexLock lock(&mu_);
    OPTSTEP_RETURN_IF_ERROR(CheckFresh(c));
    if (c.retry || c.replay) return absl::OkStatus();  // already counted once
    OPTSTEP_RETURN_IF_ERROR(contributions_.AddRange(c.trainer, param_id, offset, count));
    ++inflight_copies_;
  }
  absl::Status status =
      device_->CopyFromHost(data, dtype, count, GradientTarget(c.trainer, param_id), offset);
  absl::MutexLock lock(&mu_);
  --inflight_copies_;
  return status;
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
          return absl::InvalidArgumentError(absl::StrCat(
              "step ", c.step, ": trainer ", c.trainer, " commits ", num_elements,
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
      waiters_.push_back(Waiter{c.return_dtype, c.return_params, std::move(done)});
      if (contributions_.all_committed() && !running_) {
        running_ = true;
        worker_->Post([this] { RunStep(); });
      }
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
  if (param_id < 0 || param_id >= static_cast<int>(params_.size())) {
    return absl::NotFoundError(absl::StrCat("param_id ", param_id, " not found: session '", id_,
                                            "' has ", params_.size(), " parameters"));
  }
  const std::string& name = names_[param_id];
  const size_t size = DTypeSize(dtype);
  if (bytes % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "': ", bytes,
                                                   " bytes is not a multiple of the ",
                                                   DTypeName(dtype), " element size ", size));
  }
  const int64_t count = static_cast<int64_t>(bytes / size);
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
  // Read the masters on the worker, which is the only writer, so the values are of one step.
  worker_->Post([this, dtype, done = std::move(done)] {
    uint64_t step;
    {
      absl::MutexLock lock(&mu_);
      step = step_;
    }
    auto snapshot = BuildSnapshot(dtype, step);
    if (snapshot.ok()) {
      absl::MutexLock lock(&mu_);
      if (step_ == step) snapshots_[dtype] = *snapshot;
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

std::vector<StepCallback> Session::AbortLocked() {
  ++generation_;
  contributions_.Reset();
  schedule_.reset();
  step_began_.reset();
  std::vector<StepCallback> callbacks;
  for (Waiter& w : waiters_) callbacks.push_back(std::move(w.done));
  waiters_.clear();
  return callbacks;
}

void Session::AbortIfExpired(absl::Time now) {
  std::vector<StepCallback> callbacks;
  absl::Status reason;
  {
    absl::MutexLock lock(&mu_);
    if (running_ || !step_began_ || now - *step_began_ < step_deadline_) return;
    reason = absl::AbortedError(absl::StrCat("session '", id_, "': step ", step_ + 1,
                                             " aborted: contributions incomplete after the ",
                                             absl::FormatDuration(step_deadline_),
                                             " step deadline; redo the step"));
    LOG(WARNING) << reason.message();
    callbacks = AbortLocked();
  }
  for (StepCallback& done : callbacks) done(reason);
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

void Session::RunStep() {
  std::vector<std::pair<double, double>> schedule;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* inflight) { return *inflight == 0; }, &inflight_copies_));
    schedule = *schedule_;
  }
  absl::StatusOr<StepOutcome> outcome = ApplyStep(schedule);
  if (!outcome.ok()) LOG(ERROR) << "session " << id_ << ": step failed: " << outcome.status();

  std::vector<Waiter> waiters;
  std::map<DType, std::shared_ptr<const ParamSnapshot>> snapshots;
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
    ++generation_;
    contributions_.Reset();
    schedule_.reset();
    step_began_.reset();
    snapshots_.clear();
  }
  // Serialise the parameters once per requested dtype, shared by every trainer.
  if (outcome.ok()) {
    uint64_t step = outcome->step;
    for (const Waiter& w : waiters) {
      if (!w.want_params || snapshots.count(w.dtype) > 0) continue;
      auto snapshot = BuildSnapshot(w.dtype, step);
      if (!snapshot.ok()) {
        outcome = snapshot.status();
        break;
      }
      snapshots[w.dtype] = *snapshot;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (outcome.ok()) snapshots_ = snapshots;
    running_ = false;
  }
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

absl::StatusOr<StepOutcome> Session::ApplyStep(
    const std::vector<std::pair<double, double>>& schedule) {
  StepOutcome outcome;
  const int n = config_.num_trainers;
  std::vector<int> owned;
  for (int p = 0; p < static_cast<int>(params_.size()); ++p) {
    if (layout_.owner[p] == rank_) owned.push_back(p);
  }
  // 1. Average REPLICATED contributions in trainer order.
  if (config_.mode == GradientMode::kReplicated && n > 1) {
    for (int p : owned) {
      for (int t = 1; t < n; ++t) OPTSTEP_RETURN_IF_ERROR(device_->Add(staging_[t - 1][p], grads_[p]));
      OPTSTEP_RETURN_IF_ERROR(device_->Scale(1.0f / static_cast<float>(n), grads_[p]));
    }
  }
  // 2-3. Non-finite check and global norm, per-parameter sums added in parameter order.
  double sum_squares = 0.0;
  bool finite = true;
  for (int p : owned) {
    OPTSTEP_ASSIGN_OR_RETURN(GradientStats stats, device_->ComputeGradientStats(grads_[p]));
    finite = finite && stats.all_finite;
    sum_squares += stats.sum_squares;
  }
  if (!finite) {
    outcome.skipped = true;
    return outcome;
  }
  outcome.grad_norm = std::sqrt(sum_squares);
  // 4. Clip: c = clip / (norm + 1e-6), applied only when c < 1.
  const double clip = config_.chain.clip_grad;
  if (clip > 0.0) {
    const double coef = clip / (outcome.grad_norm + 1e-6);
    if (coef < 1.0) {
      outcome.clipped = true;
      for (int p : owned) OPTSTEP_RETURN_IF_ERROR(device_->Scale(static_cast<float>(coef), grads_[p]));
    }
  }
  // 5. Each group steps its parameters.
  for (GroupRuntime& group : groups_) {
    StepArgs args;
    args.lr = schedule[group.def.id].first;
    args.weight_decay = schedule[group.def.id].second * group.def.wd_mult;
    args.group_step = static_cast<int64_t>(group.applied_steps) + 1;
    for (int p : group.def.param_ids) {
      if (layout_.owner[p] != rank_) continue;
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->Step(*device_, args, grads_[p], params_[p], states_[p]));
    }
    ++group.applied_steps;
  }
  OPTSTEP_RETURN_IF_ERROR(device_->Synchronize());
  return outcome;
}

}  // namespace optstep
