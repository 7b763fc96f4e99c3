#ifndef OPTSTEP_SERVER_RPC_HEALTH_SERVICE_H_
#define OPTSTEP_SERVER_RPC_HEALTH_SERVICE_H_

// grpc.health.v1 as a rank serves it (HealthService): every service it knows answers NOT_SERVING
// until the rank says otherwise. gRPC's default health service answers SERVING for the overall
// service ("") from the moment the port opens until the server sets it otherwise, so a rank that
// knew nothing yet (no group joined, no session restored) answered SERVING for a moment to
// Kubernetes probes and to trainers.

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/health/v1/health.pb.h"

namespace optstep {

// The grpc.health.v1 protocol over a fixed set of service names. Check answers a known service's
// status, NOT_FOUND for any other name; Watch streams it, at once and at each change, one write
// at a time (a status not yet sent gives way to a newer one), and SERVICE_UNKNOWN for any other
// name, which it keeps watching, as the protocol says. A Watch stream ends when its client
// cancels it or at Shutdown. Health calls take no credential, so what one holds is bounded: a
// Watch of a name longer than kMaxServiceNameBytes (which no service has) is refused
// INVALID_ARGUMENT, and beyond `max_watchers` open Watch streams, or `max_watchers_per_peer`
// from one peer host (so that one client cannot take them all), RESOURCE_EXHAUSTED.
//
// Callback API; thread-safe. Must outlive the grpc::Server that serves it (as every registered
// service), and that server's Shutdown must not wait without a deadline for the Watch streams
// while this service is not shut down: they end at Shutdown (or when gRPC cancels them).
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The longest service name a Watch may name, and how many Watch streams may be open at once
  // by default (load balancers' and monitors' health checks, a few per client).
  static constexpr size_t kMaxServiceNameBytes = 256;
  static constexpr size_t kDefaultMaxWatchers = 1024;
  static constexpr size_t kDefaultMaxWatchersPerPeer = 64;

  // Knows `services` ("" is the overall health), each NOT_SERVING. A Watch stream whose client
  // does not take a write within `idle_timeout` is cancelled (zero: no bound).
  explicit HealthService(const std::vector<std::string>& services,
                         absl::Duration idle_timeout = absl::ZeroDuration(),
                         size_t max_watchers = kDefaultMaxWatchers,
                         size_t max_watchers_per_peer = kDefaultMaxWatchersPerPeer);
  // Shutdown().
  ~HealthService() override;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // Sets `service` SERVING or NOT_SERVING; its watchers are told when that changes it. Ignored
  // after Shutdown.
  // REQUIRES: `service` is one of the names given at construction (CHECKed).
  void SetServingStatus(absl::string_view service, bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  // Every service NOT_SERVING for good: later SetServingStatus calls are ignored, as
  // grpc::HealthCheckServiceInterface::Shutdown documents. Every open Watch stream writes
  // NOT_SERVING (SERVICE_UNKNOWN for an unknown name) if it has not yet, then ends OK; a later
  // Watch does the same at once. Check still answers. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  struct Watched {
    std::weak_ptr<Watcher> watcher;
    std::string peer;  // PeerHost
  };

  // `service`'s status; SERVICE_UNKNOWN for a name this service does not know.
  ServingStatus StatusLocked(absl::string_view service) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Called by `watcher`'s OnDone: it is told nothing more.
  void Forget(Watcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration idle_timeout_;
  const size_t max_watchers_;
  const size_t max_watchers_per_peer_;
  // Lock order: mu_, then a Watcher's own lock (the service tells its watchers under mu_, so in
  // the order of the changes); a watcher takes mu_ (Forget) only outside its own lock.
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, ServingStatus> statuses_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // The open Watch streams, from Watch until their OnDone (Forget) or Shutdown. Weak: each owns
  // itself until OnDone. One taken here just before its OnDone may still be told after it, and
  // then finds itself finished: nothing reaches its call after OnDone.
  absl::flat_hash_map<Watcher*, Watched> watchers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> per_peer_ ABSL_GUARDED_BY(mu_);  // of watchers_
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_HEALTH_SERVICE_H_
