#ifndef OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
#define OPTSTEP_SERVER_RPC_STEP_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include "server/engine/engine.h"

namespace optstep {

// Starts the reactor of one Step stream (header, chunks, commit -> result, parameters). The
// stream is raw: requests are decoded by hand from the received slices (raw_step_codec.h), so a
// gradient chunk's bytes are copied once, from the network buffers into the step's buffers, and
// parameter chunks go out as slices of the shared snapshot. The reactor owns itself and is
// released after OnDone; reactions never block: the step itself runs on the engine's device
// worker, which calls back when the step is applied or aborted.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartStepReactor(Engine* engine);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
