#ifndef OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
#define OPTSTEP_SERVER_RPC_STEP_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/rpc/caller.h"
#include "server/rpc/live_step_streams.h"

namespace optstep {

// Bounds on one Step stream before its commit (docs/security.md). Beyond either the stream ends,
// naming the bound, and its contribution stays pending: nothing of it is applied, and the
// trainer may begin the step again on a new stream.
struct StepStreamLimits {
  // Bytes of messages a stream may send before its commit: RESOURCE_EXHAUSTED beyond. 0: twice
  // the session's gradient buffers on this rank (a full gradient of its parameters, at most
  // fp32, with room for resends) plus kStepStreamSlackBytes.
  int64_t max_bytes = 0;
  // Time a stream may wait on its trainer (a message not yet received, an answer not yet taken):
  // DEADLINE_EXCEEDED beyond (IdleBound; a stream whose answer is not taken is cancelled). The
  // other streams of a session (InitParameters, PullParameters, ExportStateDict, a Save's or
  // Load's progress) have the same bound. Zero or infinite: no bound.
  absl::Duration idle_timeout = absl::Minutes(1);
  // Streams one caller (CallerKey) may have open before their header (LiveStepStreams):
  // RESOURCE_EXHAUSTED beyond.
  int max_headerless_per_caller = LiveStepStreams::kDefaultMaxHeaderlessPerCaller;
  // What a stream the rank does not read may make it hold: its HTTP/2 window and a message
  // (ServerOptions). A stream waiting for its trainer's turn takes them from its owner's places
  // in the headroom or from the budget (RESOURCE_EXHAUSTED when neither has them). 0: not taken.
  int64_t waiting_bytes = 0;
};

// Headers and framing beyond the gradient bytes, in the derived bound of StepStreamLimits.
inline constexpr int64_t kStepStreamSlackBytes = 1 << 20;

// Why this rank takes no new step (OK while it takes them): a stream whose step has not begun on
// this rank is refused with it, while the other trainers of a step already pending may still join
// that step, so that it completes.
using NewStepsStatus = std::function<absl::Status()>;

// Starts the reactor of one Step stream (header, chunks, commit -> result, parameters). The
// stream is raw: requests are decoded by hand from the received slices (raw_step_codec.h), so a
// gradient chunk's bytes are copied once, from the network buffers into the step's buffers, and
// parameter chunks go out as slices of the shared snapshot. The reactor owns itself and is
// released after OnDone; reactions never block: the step itself runs on the engine's device
// worker, which calls back when the step is applied or aborted. Only a session `caller` may see
// is stepped (caller.h). The stream is in `streams` (may be null) while it is open.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartStepReactor(
    grpc::CallbackServerContext* context, Engine* engine, Caller caller,
    const StepStreamLimits& limits, NewStepsStatus new_steps, LiveStepStreams* streams);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STEP_REACTOR_H_
