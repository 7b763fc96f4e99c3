#ifndef OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
#define OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/caller.h"

namespace optstep {

// PullParameters: streams the snapshot of the last step of a session the caller of `context` may
// see. A write the caller does not take within `idle_timeout` cancels the call (IdleBound). Owns
// itself until OnDone.
grpc::ServerWriteReactor<v1::PullParametersResponse>* StartPullReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, Engine* engine,
    const v1::PullParametersRequest* request);

// InitParameters: stages initial values chunk by chunk and writes them all once the stream ended
// with an agreeing StreamEnd (nothing otherwise), into a session the caller of `context` may see.
// A caller that sends nothing for `idle_timeout` has the call cancelled (CallIdleWatch): nothing
// is written. Owns itself until OnDone.
grpc::ServerReadReactor<v1::InitParametersRequest>* StartInitReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, Engine* engine,
    v1::InitParametersResponse* response);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
