#ifndef OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
#define OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "server/engine/engine.h"

namespace optstep {

// The checkpoint service of the v1 API. ExportStateDict / ImportStateDict stream a session's
// state dict (one rank for now); Save and Load are not implemented in this build (the generated
// base class answers UNIMPLEMENTED). Thread-safe.
class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {
 public:
  // `engine` must outlive the service.
  explicit CheckpointServiceImpl(Engine* engine) : engine_(engine) {}

  grpc::ServerWriteReactor<v1::StateDictChunk>* ExportStateDict(
      grpc::CallbackServerContext* context, const v1::ExportStateDictRequest* request) override;
  grpc::ServerReadReactor<v1::StateDictChunk>* ImportStateDict(
      grpc::CallbackServerContext* context, v1::ImportStateDictResponse* response) override;

 private:
  Engine* const engine_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
