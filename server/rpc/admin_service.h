#ifndef OPTSTEP_SERVER_RPC_ADMIN_SERVICE_H_
#define OPTSTEP_SERVER_RPC_ADMIN_SERVICE_H_

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "optstep/v1/admin_service.grpc.pb.h"

namespace optstep {

// Asks the process to shut down as SIGTERM does; called with the request's reason. Must not
// block: the process's own shutdown path does the work (main.cc).
using ShutdownRequestCallback = std::function<void(const std::string& reason)>;

// Admin calls about the process (admin_service.proto). Callback API; thread-safe.
class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  // A null `on_shutdown` answers Shutdown with FAILED_PRECONDITION.
  explicit AdminServiceImpl(ShutdownRequestCallback on_shutdown)
      : on_shutdown_(std::move(on_shutdown)) {}

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const v1::ShutdownRequest* request,
                                     v1::ShutdownResponse* response) override;

 private:
  const ShutdownRequestCallback on_shutdown_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_ADMIN_SERVICE_H_
