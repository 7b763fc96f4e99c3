#include "server/engine/engine.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "base/random_bytes.h"
#include "base/status_macros.h"
#include "checkpoint/partition.h"
#include "glog/logging.h"
#include "server/engine/cost_model.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " out of range for world size ", options.world_size));
  }
  std::shared_ptr<Device> device = options.injected_device;
  if (device == nullptr) {
    OPTSTEP_ASSIGN_OR_RETURN(device, CreateDevice(options.device));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(options), std::move(device)));
}

namespace {

// The rank's admission control over the budget ResolveMemoryBudget finds, logged with its source.
std::unique_ptr<SessionAdmission> CreateAdmission(const EngineOptions& options,
                                                  const Device& device) {
  if (options.share_budget_of != nullptr) {
    LOG(INFO) << "rank " << options.rank << ": memory budget of "
              << options.share_budget_of->budget() << " bytes, shared with its host's rank";
    return std::make_unique<SessionAdmission>(*options.share_budget_of, options.max_session_bytes,
                                              options.rank, options.state_redundancy);
  }
  MemoryLimit budget = ResolveMemoryBudget(options.memory_budget, device.memory_capacity());
  if (budget.bytes <= 0) {
    LOG(WARNING) << "rank " << options.rank
                 << ": no memory limit found; sessions are admitted without a memory budget";
    budget.bytes = std::numeric_limits<int64_t>::max();
  } else {
    LOG(INFO) << "rank " << options.rank << ": memory budget " << budget.bytes << " bytes ("
              << budget.source << ")";
  }
  auto admission = std::make_unique<SessionAdmission>(budget.bytes, options.max_session_bytes,
                                                      options.rank, options.state_redundancy);
  // The budget of a device with memory of its own takes none of the host's.
  const int64_t headroom =
      options.memory_headroom > 0
          ? options.memory_headroom
          : DefaultStreamHeadroom(device.memory_capacity() > 0 ? 0 : budget.bytes);
  admission->budget().set_headroom(headroom);
  LOG(INFO) << "rank " << options.rank << ": headroom of " << headroom
            << " bytes for the copies streams hold outside the budget";
  return admission;
}

}  // namespace

Engine::Engine(EngineOptions options, std::shared_ptr<Device> device)
    : options_(std::move(options)),
      device_(std::move(device)),
      device_worker_(std::make_shared<FairExecutor>()),
      admission_(CreateAdmission(options_, *device_)),
      shared_segments_(&admission_->budget(), options_.rank, options_.max_shared_segments),
      deadline_thread_([this] { WatchDeadlines(); }) {}

Engine::~Engine() {
  std::map<std::string, std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    sessions = sessions_;
  }
  deadline_thread_.join();
  for (auto& entry : sessions) entry.second->Close();
  device_worker_.reset();  // the last session to go runs what is queued and joins it
}

void Engine::WatchDeadlines() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50))) {
    std::vector<std::shared_ptr<Session>> sessions;
    for (auto& entry : sessions_) sessions.push_back(entry.second);
    mu_.Unlock();
    const absl::Time now = absl::Now();
    for (auto& session : sessions) {
      session->holds().ExpireHold(now);
      session->AbortIfExpired(now);
    }
    WatchDevice(now);
    mu_.Lock();
  }
}

void Engine::SetAbortVoteListener(AbortVoteListener listener) {
  absl::MutexLock lock(&abort_relay_->mu);
  abort_relay_->listener = std::move(listener);
}

absl::Status SessionNotFoundError(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session '", CallerText(id), "' not found"));
}

std::string Engine::NextSessionId() { return absl::StrCat("s", RandomHex(16)); }

absl::StatusOr<Engine::Created> Engine::FindExisting(const SessionConfig& config) const {
  absl::MutexLock lock(&mu_);
  return FindExistingLocked(config);
}

absl::StatusOr<Engine::Created> Engine::FindExistingLocked(const SessionConfig& config) const {
  // A retried creation comes first: its session may also carry the name of another's.
  if (!config.request_id.empty()) {
    for (auto& [id, session] : sessions_) {
      const SessionConfig& existing = session->config();
      if (existing.owner != config.owner || existing.request_id != config.request_id) continue;
      if (existing.definition_key != config.definition_key) {
        return absl::FailedPreconditionError(
            absl::StrCat("request_id '", CallerText(config.request_id), "' created session ", id,
                         " with a different definition; a new session needs a new request_id"));
      }
      return Created{session, false};
    }
  }
  if (!config.name.empty()) {
    for (auto& [id, session] : sessions_) {
      if (session->config().name != config.name || session->config().owner != config.owner) {
        continue;
      }
      if (session->config().definition_key != config.definition_key) {
        return absl::FailedPreconditionError(
            absl::StrCat("session '", config.name, "' (", id,
                         ") exists with a different definition; close it or use another name"));
      }
      return Created{session, true};
    }
  }
  return Created{};
}

absl::StatusOr<Layout> Engine::LayoutOf(const SessionConfig& config) const {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<double> costs,
                           EstimateStepCosts(config.chain, config.params));
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<int64_t> bytes,
                           EstimateOwnedBytes(config.chain, config.params));
  return PartitionByCostAndMemory(costs, bytes, options_.world_size);
}

absl::Status Engine::CheckParamCount(const SessionConfig& config) const {
  if (static_cast<int64_t>(config.params.size()) <= options_.max_params_per_session) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat("session declares ", config.params.size(),
                                                   " parameters; the limit is ",
                                                   options_.max_params_per_session));
}

absl::Status Engine::CheckAdmission(const SessionConfig& config, bool new_session) {
  // Before the layout: routing and partitioning grow with the parameters.
  OPTSTEP_RETURN_IF_ERROR(CheckParamCount(config));
  OPTSTEP_ASSIGN_OR_RETURN(Layout layout, LayoutOf(config));
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t bytes, admission_->Check(config, layout, "new"));
  if (!new_session) return absl::OkStatus();
  const std::string asker = config.name.empty() ? std::string("a new session")
                                                : absl::StrCat("session '", config.name, "'");
  return CheckOwnerShare(config.owner, asker, bytes, HoldingsOf(config.owner),
                         OwnerLimits{options_.max_sessions_per_owner, options_.owner_memory_share},
                         admission_->budget().budget(), options_.rank);
}

OwnerHoldings Engine::HoldingsOf(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  OwnerHoldings held;
  for (const auto& [id, session] : sessions_) {
    if (session->config().owner != owner) continue;
    ++held.sessions;
    held.segments += shared_segments_.count(id);
  }
  // Its sessions, the snapshots their streams hold and their trainers' shared memory.
  held.bytes = admission_->budget().HeldBy(owner);
  return held;
}

absl::StatusOr<std::shared_ptr<Session>> Engine::BuildSession(const std::string& id,
                                                              SessionConfig config) {
  OPTSTEP_RETURN_IF_ERROR(CheckParamCount(config));
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat("the server holds ", sessions_.size(),
                                                       " sessions; the limit is ",
                                                       options_.max_sessions));
    }
    if (sessions_.count(id) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("session '", id, "' exists on rank ", options_.rank));
    }
  }
  Session::Options session_options;
  session_options.id = id;
  OPTSTEP_ASSIGN_OR_RETURN(session_options.layout, LayoutOf(config));
  OPTSTEP_ASSIGN_OR_RETURN(MemoryBudget::Reservation reservation,
                           admission_->Admit(config, session_options.layout, id));
  session_options.rank = options_.rank;
  session_options.step_deadline = config.step_deadline > absl::ZeroDuration()
                                      ? config.step_deadline
                                      : options_.default_step_deadline;
  session_options.max_bytes = options_.max_session_bytes;
  session_options.state_redundancy = options_.state_redundancy;
  session_options.observer = options_.step_observer;
  session_options.on_abort_vote = [relay = abort_relay_, id](uint64_t resolution, uint64_t step) {
    absl::MutexLock lock(&relay->mu);
    if (relay->listener) relay->listener(id, resolution, step);
  };
  session_options.reserve_held_snapshot =
      [budget = admission_->budget().Alias(), share = options_.owner_memory_share, id,
       owner = config.owner,
       rank = options_.rank](int64_t bytes) -> absl::StatusOr<MemoryBudget::Reservation> {
    return ReserveAsOwner(*budget, bytes,
                          absl::StrCat("a snapshot held for streams of session '", id, "'"),
                          "the parameters of an earlier step", owner, share, rank);
  };
  session_options.config = std::move(config);
  if (options_.make_communicator) {
    OPTSTEP_ASSIGN_OR_RETURN(session_options.comm, options_.make_communicator(id));
  } else {
    CommunicatorOptions local;
    local.kind = "local";
    OPTSTEP_ASSIGN_OR_RETURN(session_options.comm, CreateCommunicator(local));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           Session::Create(std::move(session_options), device_, device_worker_));
  session->HoldReservation(std::move(reservation));
  return session;
}

absl::StatusOr<Engine::Created> Engine::Register(std::shared_ptr<Session> session, bool by_name) {
  absl::MutexLock lock(&mu_);
  if (by_name) {  // another trainer, or a retry of this call, may have created it meanwhile
    OPTSTEP_ASSIGN_OR_RETURN(Created existing, FindExistingLocked(session->config()));
    if (existing.session != nullptr) return existing;
  }
  if (!sessions_.emplace(session->id(), session).second) {
    return absl::AlreadyExistsError(absl::StrCat("session '", session->id(), "' exists"));
  }
  return Created{session, false, true};
}

absl::StatusOr<Engine::Created> Engine::CreateSession(SessionConfig config) {
  OPTSTEP_ASSIGN_OR_RETURN(Created existing, FindExisting(config));
  if (existing.session != nullptr) return existing;
  OPTSTEP_RETURN_IF_ERROR(CheckAdmission(config));
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> built,
                           BuildSession(NextSessionId(), std::move(config)));
  OPTSTEP_ASSIGN_OR_RETURN(Created created, Register(std::move(built), /*by_name=*/true));
  if (created.made) ReportCreated(*created.session);
  return created;
}

absl::StatusOr<std::shared_ptr<Session>> Engine::CreateReplica(
    const std::string& id, SessionConfig config, std::optional<uint64_t> heal_generation) {
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> built, BuildSession(id, std::move(config)));
  if (heal_generation.has_value()) {  // nothing runs on it yet: no wait
    OPTSTEP_RETURN_IF_ERROR(built->PauseForHeal(*heal_generation, absl::InfiniteFuture()));
  }
  // Rank 0 decided the id (and attaches by name itself): a replica registers under its id.
  OPTSTEP_ASSIGN_OR_RETURN(Created created, Register(std::move(built), /*by_name=*/false));
  ReportCreated(*created.session);
  return created.session;
}

void Engine::ReportCreated(const Session& session) const {
  if (options_.step_observer == nullptr) return;
  options_.step_observer->OnSessionCreated(session.id(), options_.rank,
                                           static_cast<int64_t>(session.config().params.size()));
}

void Engine::WatchDevice(absl::Time now) {
  const absl::Duration limit = options_.device_watchdog;
  if (limit <= absl::ZeroDuration()) return;
  const std::optional<FairExecutor::Running> running = device_worker_->running();
  const bool stalled = running && now - running->started > limit;
  absl::MutexLock lock(&mu_);
  if (stalled == device_stalled_) return;
  device_stalled_ = stalled;
  if (stalled) {
    LOG(ERROR) << "event=device_stalled rank=" << options_.rank << " task=\"" << running->label
               << "\" session=" << running->queue
               << " running_for_ms=" << absl::ToInt64Milliseconds(now - running->started)
               << " watchdog_ms=" << absl::ToInt64Milliseconds(limit)
               << ": the device worker makes no progress; health is NOT_SERVING until the task "
                  "ends";
  } else {
    LOG(WARNING) << "event=device_recovered rank=" << options_.rank
                 << ": the stalled device task ended";
  }
}

Engine::DeviceActivity Engine::device_activity() const {
  DeviceActivity activity;
  const std::optional<FairExecutor::Running> running = device_worker_->running();
  if (running) activity.running_for = absl::Now() - running->started;
  absl::MutexLock lock(&mu_);
  activity.stalled = device_stalled_;
  return activity;
}

bool Engine::healthy() const {
  {
    absl::MutexLock lock(&mu_);
    if (device_stalled_) return false;
  }
  // Each session asked outside the engine's lock: one whose lock is held a while holds this
  // check only, not every caller that looks a session up.
  for (const auto& session : ListSessions()) {
    if (!session->healthy()) return false;
  }
  return true;
}

bool Engine::live() const {
  {
    absl::MutexLock lock(&mu_);
    if (device_stalled_) return false;
  }
  for (const auto& session : ListSessions()) {
    const Session::Health health = session->health();
    if (!health.healthy() && !health.interrupted.has_value()) return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<Session>> Engine::GetSession(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return SessionNotFoundError(id);
  return it->second;
}

std::vector<std::shared_ptr<Session>> Engine::ListSessions() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& entry : sessions_) sessions.push_back(entry.second);
  return sessions;
}

absl::StatusOr<MemoryBudget::Reservation> Engine::ReserveMemory(int64_t bytes,
                                                                absl::string_view asker,
                                                                absl::string_view detail,
                                                                absl::string_view owner) {
  return ReserveAsOwner(admission_->budget(), bytes, asker, detail, owner,
                        options_.owner_memory_share, options_.rank);
}

std::optional<MemoryBudget::HeadroomBytes> Engine::TryTakeHeadroom(int64_t bytes,
                                                                   const std::string& owner) {
  MemoryBudget& budget = admission_->budget();
  return budget.TryTakeHeadroom(bytes, owner,
                                OwnerShareOf(options_.owner_memory_share, budget.headroom()));
}

absl::StatusOr<std::shared_ptr<const SharedSegment>> Engine::AttachSharedMemory(
    const Session& session, int trainer) {
  if (!options_.shared_memory) {
    return absl::FailedPreconditionError(
        "this rank shares no memory with trainers (--shared_memory=false)");
  }
  const SessionConfig& config = session.config();
  if (config.mode != GradientMode::kReplicated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", session.id(),
        "' has SHARDED gradients; shared memory carries whole gradients (REPLICATED) only"));
  }
  OPTSTEP_RETURN_IF_ERROR(session.CheckTrainer(trainer));
  // The owner's share holds its sessions' segments too: a session of many trainers would
  // otherwise fill the rank's budget with them, past its owner's share. One attach at a time,
  // so that trainers attaching at once are each checked against the others' segments.
  absl::MutexLock attaching(&attach_mu_);
  OwnerHoldings held = HoldingsOf(config.owner);
  held.bytes -= shared_segments_.bytes(session.id(), trainer);  // replaced by the new one
  OPTSTEP_RETURN_IF_ERROR(CheckOwnerShare(
      config.owner,
      absl::StrCat("shared memory of trainer ", trainer, " of session '", session.id(), "'"),
      SharedSegments::BytesFor(config.params, session.layout(), options_.rank), held,
      OwnerLimits{/*max_sessions=*/0, options_.owner_memory_share}, admission_->budget().budget(),
      options_.rank));
  // And its share of the segments, each a descriptor of the rank's: one owner's trainers would
  // otherwise take every segment, and every other tenant's trainers step through their streams.
  if (options_.owner_memory_share < 1.0) {
    const int most = std::max(
        1, static_cast<int>(options_.owner_memory_share * shared_segments_.max_segments()));
    const int others = held.segments - shared_segments_.current(session.id(), trainer);
    if (others >= most) {
      return absl::ResourceExhaustedError(absl::StrCat(
          OwnerName(config.owner), " holds ", others,
          " memory segments shared with trainers on rank ", options_.rank,
          ", the most one owner may (--owner_memory_share ", options_.owner_memory_share,
          " of --max_shared_segments ", shared_segments_.max_segments(), "); trainer ", trainer,
          " of session '", session.id(), "' steps through its stream"));
    }
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<const SharedSegment> segment,
                           shared_segments_.Attach(session.id(), trainer, config.params,
                                                   session.layout(), config.owner));
  // Closed meanwhile (CloseSession unregisters a session, then drops its segments): this one
  // came after that drop, and would keep its bytes and descriptor until the process ends.
  bool open = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session.id());
    open = it != sessions_.end() && it->second.get() == &session;
  }
  if (!open) {
    shared_segments_.Drop(session.id(), trainer);
    return SessionNotFoundError(session.id());
  }
  return segment;
}

absl::Status Engine::CloseSession(const std::string& id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return SessionNotFoundError(id);
    session = std::move(it->second);
    sessions_.erase(it);
  }
  session->Close();
  shared_segments_.DropSession(id);
  if (options_.step_observer) options_.step_observer->OnSessionClosed(id, options_.rank);
  // The last reference, unless a call in progress still holds one (a coordinator task or a
  // stream that is ending lets go in a moment; one its caller keeps open, when it ends): the
  // reservation is released with it (Session::HoldReservation).
  session.reset();
  ReturnFreedMemoryToSystem();
  return absl::OkStatus();
}

}  // namespace optstep
