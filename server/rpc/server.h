#ifndef OPTSTEP_SERVER_RPC_SERVER_H_
#define OPTSTEP_SERVER_RPC_SERVER_H_

// The gRPC server of one rank (Server): it binds the port and serves the optimizer, checkpoint,
// admin and peer services, grpc.health.v1 (readiness, and liveness as kLivenessService; our own
// HealthService, NOT_SERVING from the moment the port opens) and reflection over the rank's Engine
// and RankGroup, as ServerOptions say.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/auth.h"
#include "server/rpc/call_tracker.h"
#include "server/rpc/checkpoint_service.h"
#include "server/rpc/credentials.h"
#include "server/rpc/health_service.h"
#include "server/rpc/live_step_streams.h"
#include "server/rpc/metrics.h"
#include "server/rpc/optimizer_service.h"
#include "server/rpc/peer_service.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/rendezvous.h"

namespace optstep {

struct ServerOptions {
  // Serve the group's rendezvous store (rank 0 of a group of several ranks).
  bool serve_rendezvous = false;
  std::string host = "0.0.0.0";
  int port = 0;  // 0: pick a free port
  // Largest gRPC message accepted; a 4 MiB chunk plus framing fits the default.
  int max_message_bytes = (4 << 20) + (64 << 10);
  // The HTTP/2 flow-control window of each stream received: what the transport buffers of a
  // stream the rank does not read (a Step stream after its commit, or waiting for its turn), so
  // what a caller can make the rank hold per stream beside its message in hand.
  int stream_window_bytes = 16 << 20;
  // Bounds on each Step stream before its commit.
  StepStreamLimits step_stream;
  // TLS on the port (docs/security.md); disabled by default: plaintext.
  TlsFiles tls;
  // Set: every call but grpc.health.v1 needs a bearer token of this table (requires TLS).
  std::optional<TokenTable> tokens;
  // Mutual TLS (`tls.client_ca_file`) without `tokens`: the role of every call but grpc.health.v1
  // comes from its client certificate's common name (MakeSubjectProcessor).
  SubjectRoles subjects;
  // Counts calls, streams and errors; may be null. Must outlive the server.
  ServerMetrics* metrics = nullptr;
  // AdminService.Shutdown calls this (admin role where tokens are on); null refuses the call.
  ShutdownRequestCallback on_shutdown_request;
};

// The grpc.health.v1 service name that answers whether the rank's process works (Engine::live:
// no device task stalled, no session broken; one interrupted by a lost peer waits for the heal),
// whatever its peers do: a liveness probe
// asks it, so that a rank waiting for a lost peer to rejoin is not restarted meanwhile. The
// overall health ("") is the readiness: SERVING only while the whole group serves.
inline constexpr char kLivenessService[] = "optstep.liveness";

// The gRPC server of one rank: optimizer, checkpoint and admin services, grpc.health.v1 and
// reflection.
// Thread-safe.
class Server {
 public:
  // Binds and starts serving the optimizer, checkpoint and peer services (and, with
  // `serve_rendezvous`, the group's rendezvous store). Health answers NOT_SERVING from the
  // moment the port opens: "" until SetReady(true), kLivenessService until the health thread
  // first finds the engine live (at once). UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options, Engine* engine,
                                                       RankGroup* group);
  ~Server();

  int port() const { return port_; }
  // Health SERVING when `ready`, the engine is healthy and no peer is lost or gone
  // (RankGroup::PeersStatus; checked until Shutdown); kLivenessService SERVING while the engine
  // is live.
  void SetReady(bool ready);
  // Health NOT_SERVING for good (its Watch streams end) and new Step streams refused
  // (UNAVAILABLE) at once; then waits for the Step streams in progress to end, until
  // `steps_deadline`, and ends those still open UNAVAILABLE (LiveStepStreams), giving their
  // statuses a second to go out; then stops accepting calls and waits for running ones until
  // `deadline` (cancelling what is left).
  // Idempotent.
  void Shutdown(absl::Time deadline, absl::Time steps_deadline);
  void Shutdown(absl::Time deadline) { Shutdown(deadline, deadline); }
  // Blocks until Shutdown completes.
  void Wait();

 private:
  Server(Engine* engine, RankGroup* group, const ServerOptions& options)
      : engine_(engine),
        tracker_(options.metrics),
        streams_(options.step_stream.max_headerless_per_caller),
        optimizer_service_(engine, group, StepLimitsOf(options), options.max_message_bytes,
                           &streams_),
        checkpoint_service_(engine, group, options.step_stream.idle_timeout),
        peer_service_(engine, group),
        admin_service_(options.on_shutdown_request),
        health_({"", kLivenessService}, options.step_stream.idle_timeout),
        group_(group) {}
  void WatchHealth();
  // options.step_stream, with what a stream the rank does not read holds (its window, a message).
  static StepStreamLimits StepLimitsOf(const ServerOptions& options) {
    StepStreamLimits limits = options.step_stream;
    limits.waiting_bytes = int64_t{options.stream_window_bytes} + options.max_message_bytes;
    return limits;
  }

  Engine* const engine_;
  CallTracker tracker_;
  LiveStepStreams streams_;
  OptimizerServiceImpl optimizer_service_;
  CheckpointServiceImpl checkpoint_service_;
  PeerServiceImpl peer_service_;
  RendezvousServiceImpl rendezvous_service_;
  AdminServiceImpl admin_service_;
  // "" (readiness) and kLivenessService. Declared before server_, which must go first.
  HealthService health_;
  RankGroup* const group_;  // may be null
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_SERVER_H_
