#include "server/rpc/health_service.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "glog/logging.h"
#include "server/rpc/owned_write_reactor.h"
#include "server/rpc/peer_host.h"

namespace optstep {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// One Watch stream (OwnedWriteReactor: it owns itself until OnDone, writes one message at a time,
// finishes once, and a write its client does not take within the idle bound cancels the call).
// The service keeps it weakly and tells it each status of its service through Update, under the
// service's lock, so in the order of the changes (StartWrite and Finish run no reaction inline,
// and the watcher takes the service's lock only in Released, outside its own). A status that
// comes while a write is in flight waits in pending_, where a newer one replaces it, so that the
// client reads the latest status soon, and never the same one twice in a row. OnDone comes only
// after Finish, hence finished_ is set before it: an Update or End that comes after OnDone (the
// service took this watcher just before) does nothing.
class HealthService::Watcher final : public OwnedWriteReactor<HealthCheckResponse, Watcher> {
 public:
  // A new watcher of `service_name` on the call of `context`, which owns itself until OnDone.
  // `service` must outlive it until then.
  static std::shared_ptr<Watcher> Create(HealthService* service, std::string service_name,
                                         grpc::CallbackServerContext* context) {
    auto watcher = std::make_shared<Watcher>(service, std::move(service_name));
    watcher->Own(watcher, context, service->idle_timeout_, "health Watch");
    return watcher;
  }
  Watcher(HealthService* service, std::string service_name)
      : service_(service), service_name_(std::move(service_name)) {}

  const std::string& service_name() const { return service_name_; }

  // Writes `status`, unless the stream is finished or ending, or `status` is what the client
  // reads last already.
  void Update(ServingStatus status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || ending_) return;
    if ((pending_.has_value() ? pending_ : written_) == status) return;
    if (written_ == status) {
      pending_.reset();  // back to what is written: the unsent change in between is moot
    } else {
      pending_ = status;
    }
    if (!WritingLocked()) WriteNextLocked();
  }

  // Ends the stream at once with `why`, writing nothing.
  void Refuse(grpc::Status why) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FinishLocked(std::move(why));
  }

  // Finishes the stream OK once what it was told is written.
  void End() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    if (!WritingLocked()) WriteNextLocked();
  }

 private:
  void WriteNextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (pending_.has_value()) {
      response_.set_status(*pending_);
      written_ = pending_;
      pending_.reset();
      WriteLocked(&response_);
    } else if (ending_) {
      FinishLocked(grpc::Status::OK);
    }
  }

  // The service's lock comes before mu_ (health_service.h): Released runs out of mu_.
  void Released() override { service_->Forget(this); }

  HealthService* const service_;
  const std::string service_name_;
  // The message of the write in flight: gRPC reads it until OnWriteDone.
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  // The status of the last write started; the one to write once no write is in flight.
  std::optional<ServingStatus> written_ ABSL_GUARDED_BY(mu_);
  std::optional<ServingStatus> pending_ ABSL_GUARDED_BY(mu_);
  // End was called: finish once nothing is pending.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(const std::vector<std::string>& services, absl::Duration idle_timeout,
                             size_t max_watchers, size_t max_watchers_per_peer)
    : idle_timeout_(idle_timeout),
      max_watchers_(max_watchers),
      max_watchers_per_peer_(max_watchers_per_peer) {
  absl::MutexLock lock(&mu_);
  for (const std::string& service : services) {
    statuses_[service] = HealthCheckResponse::NOT_SERVING;
  }
}

HealthService::~HealthService() { Shutdown(); }

void HealthService::SetServingStatus(absl::string_view service, bool serving) {
  const ServingStatus status =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  absl::MutexLock lock(&mu_);
  auto it = statuses_.find(service);
  CHECK(it != statuses_.end()) << "health: service '" << service << "' was not declared";
  if (shut_down_ || it->second == status) return;
  it->second = status;
  for (const auto& entry : watchers_) {
    std::shared_ptr<Watcher> watcher = entry.second.watcher.lock();
    if (watcher != nullptr && watcher->service_name() == service) watcher->Update(status);
  }
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& entry : statuses_) entry.second = HealthCheckResponse::NOT_SERVING;
  for (const auto& entry : watchers_) {
    std::shared_ptr<Watcher> watcher = entry.second.watcher.lock();
    if (watcher == nullptr) continue;
    watcher->Update(StatusLocked(watcher->service_name()));
    watcher->End();
  }
  // Those that end now are told nothing more; Forget finds them gone.
  watchers_.clear();
  per_peer_.clear();
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ServingStatus status;
  {
    absl::ReaderMutexLock lock(&mu_);
    status = StatusLocked(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    // What the grpc.health.v1 protocol answers for a service the server does not know.
    reactor->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     absl::StrCat("unknown service '", CallerText(request->service()), "'")));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  const std::string& name = request->service();
  // The call holds its request until it ends: a name no service has, of any length, would stay
  // held as long as the client keeps the stream.
  const bool too_long = name.size() > kMaxServiceNameBytes;
  std::shared_ptr<Watcher> watcher = Watcher::Create(this, too_long ? "" : name, context);
  if (too_long) {
    watcher->Refuse(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("health Watch: service name '", CallerText(name), "' has ", name.size(),
                     " bytes; no service's has more than ", kMaxServiceNameBytes)));
    return watcher.get();
  }
  // Writes before the reactor is returned wait in gRPC until it binds the reactor to the call.
  absl::MutexLock lock(&mu_);
  std::string peer = PeerHost(context->peer());
  if (!shut_down_ && watchers_.size() >= max_watchers_) {
    watcher->Refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrCat("health Watch: ", max_watchers_,
                                              " Watch streams are open on this rank already")));
    return watcher.get();
  }
  auto from_peer = per_peer_.find(peer);
  if (!shut_down_ && from_peer != per_peer_.end() && from_peer->second >= max_watchers_per_peer_) {
    watcher->Refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("health Watch: ", max_watchers_per_peer_, " Watch streams from ",
                     CallerText(peer), " are open on this rank already, the most one peer may")));
    return watcher.get();
  }
  watcher->Update(StatusLocked(request->service()));
  if (shut_down_) {
    watcher->End();
  } else {
    ++per_peer_[peer];
    watchers_.emplace(watcher.get(), Watched{watcher, std::move(peer)});
  }
  return watcher.get();
}

HealthService::ServingStatus HealthService::StatusLocked(absl::string_view service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::Forget(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  auto it = watchers_.find(watcher);
  if (it == watchers_.end()) return;  // Shutdown forgot it already
  auto peer = per_peer_.find(it->second.peer);
  if (--peer->second == 0) per_peer_.erase(peer);
  watchers_.erase(it);
}

}  // namespace optstep
