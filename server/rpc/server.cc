#include "server/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/rpc/request_parse_interceptor.h"

namespace optstep {
namespace {

// How long the Step streams a shutdown ends after its grace get to send their status.
constexpr absl::Duration kEndStreamsTime = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Engine* engine,
                                                      RankGroup* group) {
  // grpc.health.v1 is health_, which starts NOT_SERVING: gRPC's default service answers SERVING
  // for "" from the moment the port opens. The switch is process-global and read at
  // BuildAndStart (another server of this process, a test's fake, may have turned it on): off,
  // so that gRPC adds no service of its own beside health_.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  ServerMetrics* metrics = options.metrics;
  AuthRefusal count = [metrics](absl::string_view method, absl::string_view code) {
    if (metrics != nullptr) metrics->CountRpcError(method, code);
  };
  // Tokens name every caller; without them, mutual TLS's client certificates do.
  std::shared_ptr<grpc::AuthMetadataProcessor> processor;
  if (options.tokens) {
    processor = MakeTokenProcessor(*options.tokens, std::move(count));
  } else if (!options.tls.client_ca_file.empty()) {
    processor = MakeSubjectProcessor(options.subjects, std::move(count));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                           MakeServerCredentials(options.tls, std::move(processor)));
  std::unique_ptr<Server> server(new Server(engine, group, options));
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, credentials, &server->port_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRequestParseInterceptorFactory());
  interceptors.push_back(server->tracker_.MakeFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(&server->optimizer_service_);
  builder.RegisterService(&server->checkpoint_service_);
  builder.RegisterService(&server->peer_service_);
  builder.RegisterService(&server->admin_service_);
  builder.RegisterService(&server->health_);
  if (options.serve_rendezvous) builder.RegisterService(&server->rendezvous_service_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Transport for large streams (docs/design.md §4): no BDP probing, a fixed stream window.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  server->health_thread_ = std::thread([s = server.get()] { s->WatchHealth(); });
  return server;
}

Server::~Server() { Shutdown(absl::Now()); }

void Server::SetReady(bool ready) {
  absl::MutexLock lock(&mu_);
  ready_ = ready;
}

void Server::WatchHealth() {
  bool serving = false;
  std::optional<bool> live;
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const bool now =
        ready_ && engine_->healthy() && (group_ == nullptr || group_->PeersStatus().ok());
    // A rank whose sessions wait for a lost peer to heal back in works: it stays live.
    const bool healthy = engine_->live();
    if (now != serving) {
      serving = now;
      health_.SetServingStatus("", serving);
    }
    if (live != healthy) {
      live = healthy;
      health_.SetServingStatus(kLivenessService, healthy);
    }
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
  }
}

void Server::Shutdown(absl::Time deadline, absl::Time steps_deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // A server that never listened (Start failed) has nothing to end, and no health thread.
  if (health_thread_.joinable()) health_thread_.join();
  if (server_ == nullptr) return;
  // Every service NOT_SERVING, liveness too, for good; and its Watch streams end now, so that
  // gRPC's shutdown below does not wait for them until its deadline.
  health_.Shutdown();
  engine_->StopAcceptingSteps();
  if (!tracker_.AwaitNoSteps(steps_deadline)) {
    // The grace is over: the streams still open end UNAVAILABLE, which their trainers redo once
    // the group serves, rather than CANCELLED by gRPC's shutdown below.
    const int ended = streams_.EndAll(
        absl::StrCat("rank ", engine_->options().rank,
                     " shut down before this step ended; redo the step once the group serves"));
    LOG(WARNING) << "event=shutdown_grace_expired active_steps=" << tracker_.active_steps()
                 << " ended_unavailable=" << ended;
    // Their statuses go out before gRPC's shutdown cancels what is left.
    tracker_.AwaitNoSteps(absl::Now() + kEndStreamsTime);
  }
  server_->Shutdown(absl::ToChronoTime(deadline));
}

void Server::Wait() { server_->Wait(); }

}  // namespace optstep
