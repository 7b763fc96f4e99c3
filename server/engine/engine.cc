#include "server/engine/engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " out of range for world size ",
                                                   options.world_size));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(options.device));
  return std::unique_ptr<Engine>(new Engine(std::move(options), std::move(device)));
}

Engine::Engine(EngineOptions options, std::unique_ptr<Device> device)
    : options_(std::move(options)),
      device_(std::move(device)),
      worker_(std::make_unique<DeviceWorker>()),
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
  worker_.reset();  // runs what is queued, then joins
}

void Engine::WatchDeadlines() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50))) {
    std::vector<std::shared_ptr<Session>> sessions;
    for (auto& entry : sessions_) sessions.push_back(entry.second);
    mu_.Unlock();
    const absl::Time now = absl::Now();
    for (auto& session : sessions) session->AbortIfExpired(now);
    mu_.Lock();
  }
}

absl::StatusOr<Engine::Created> Engine::CreateSession(SessionConfig config) {
  if (static_cast<int64_t>(config.params.size()) > options_.max_params_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat("session declares ", config.params.size(),
                                                     " parameters; the limit is ",
                                                     options_.max_params_per_session));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!config.name.empty()) {
      for (auto& [id, session] : sessions_) {
        if (session->config().name != config.name) continue;
        if (session->config().definition_key != config.definition_key) {
          return absl::FailedPreconditionError(absl::StrCat(
              "session '", config.name, "' (", id,
              ") exists with a different definition; close it or use another name"));
        }
        return Created{session, true};
      }
    }
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat("the server holds ", sessions_.size(),
                                                       " sessions; the limit is ",
                                                       options_.max_sessions));
    }
  }
  // Cost model of the single-rank build: bytes of each parameter.
  std::vector<double> costs;
  for (const ParamInfo& p : config.params) costs.push_back(static_cast<double>(p.numel()));
  Session::Options session_options;
  session_options.layout = PartitionByCost(costs, options_.world_size);
  session_options.rank = options_.rank;
  session_options.step_deadline = config.step_deadline > absl::ZeroDuration()
                                      ? config.step_deadline
                                      : options_.default_step_deadline;
  session_options.max_bytes = options_.max_session_bytes;
  std::string name = config.name;
  session_options.config = std::move(config);
  {
    absl::MutexLock lock(&mu_);
    session_options.id = absl::StrFormat("s%06d", next_id_++);
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                           Session::Create(std::move(session_options), device_.get(), worker_.get()));
  absl::MutexLock lock(&mu_);
  if (!name.empty()) {  // another trainer may have created it meanwhile
    for (auto& [id, existing] : sessions_) {
      if (existing->config().name == name) {
        if (existing->config().definition_key != session->config().definition_key) {
          return absl::FailedPreconditionError(
              absl::StrCat("session '", name, "' exists with a different definition"));
        }
        return Created{existing, true};
      }
    }
  }
  sessions_[session->id()] = session;
  return Created{session, false};
}

absl::StatusOr<std::shared_ptr<Session>> Engine::GetSession(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session '", id, "' not found"));
  return it->second;
}

std::vector<std::shared_ptr<Session>> Engine::ListSessions() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& entry : sessions_) sessions.push_back(entry.second);
  return sessions;
}

absl::Status Engine::CloseSession(const std::string& id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session '", id, "' not found"));
    session = std::move(it->second);
    sessions_.erase(it);
  }
  session->Close();
  return absl::OkStatus();
}

}  // namespace optstep
