#ifndef OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
#define OPTSTEP_SERVER_RPC_STEP_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"

namespace optstep {

// Starts the reactor of one Step stream (header, chunks, commit -> result, parameters). The
// reactor owns itself and is released after OnDone; reactions never block: the step itself runs
// on the engine's device worker, which calls back when the step is applied or aborted.
grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* StartStepReactor(Engine* engine);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
