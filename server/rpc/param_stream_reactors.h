#ifndef OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
#define OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"

namespace optstep {

// PullParameters: streams the snapshot of the last step. Owns itself until OnDone.
grpc::ServerWriteReactor<v1::PullParametersResponse>* StartPullReactor(
    Engine* engine, const v1::PullParametersRequest* request);

// InitParameters: writes initial values chunk by chunk. Owns itself until OnDone.
grpc::ServerReadReactor<v1::InitParametersRequest>* StartInitReactor(
    Engine* engine, v1::InitParametersResponse* response);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_STREAM_REACTORS_H_
