#ifndef OPTSTEP_SERVER_RPC_SERVER_H_
#define OPTSTEP_SERVER_RPC_SERVER_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/rpc/checkpoint_service.h"
#include "server/rpc/optimizer_service.h"

namespace optstep {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: pick a free port
  // Largest gRPC message accepted; a 4 MiB chunk plus framing fits the default.
  int max_message_bytes = (4 << 20) + (64 << 10);
};

// The gRPC server of one rank: optimizer and checkpoint services, grpc.health.v1 and reflection.
// Thread-safe.
class Server {
 public:
  // Binds and starts serving; health is SERVING once this returns.
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options, Engine* engine);
  ~Server();

  int port() const { return port_; }
  // Health NOT_SERVING, then stops accepting calls and waits for running ones until `deadline`
  // (cancelling what is left). Idempotent.
  void Shutdown(absl::Time deadline);
  // Blocks until Shutdown completes.
  void Wait();

 private:
  Server(Engine* engine) : optimizer_service_(engine) {}

  OptimizerServiceImpl optimizer_service_;
  CheckpointServiceImpl checkpoint_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_SERVER_H_
