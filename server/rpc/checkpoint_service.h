#ifndef OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
#define OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_

#include "optstep/v1/checkpoint_service.grpc.pb.h"

namespace optstep {

// The checkpoint service of the v1 API. Registered (so that reflection and clients see it) but
// not yet implemented in this build: the generated base class answers every RPC with
// UNIMPLEMENTED.
class CheckpointServiceImpl final : public v1::CheckpointService::CallbackService {};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CHECKPOINT_SERVICE_H_
