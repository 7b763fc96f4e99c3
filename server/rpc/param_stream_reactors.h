#ifndef OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
#define OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/caller.h"

namespace optstep {

// PullParameters: streams the snapshot of the last step of a session `caller` may see. Owns
// itself until OnDone.
grpc::ServerWriteReactor<v1::PullParametersResponse>* StartPullReactor(
    Engine* engine, const Caller& caller, const v1::PullParametersRequest* request);

// InitParameters: stages initial values chunk by chunk and writes them all once the stream ended
// with an agreeing StreamEnd (nothing otherwise), into a session `caller` may see. Owns itself
// until OnDone.
grpc::ServerReadReactor<v1::InitParametersRequest>* StartInitReactor(
    Engine* engine, Caller caller, v1::InitParametersResponse* response);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
