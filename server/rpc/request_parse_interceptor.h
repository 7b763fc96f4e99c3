#ifndef OPTSTEP_SERVER_RPC_REQUEST_PARSE_INTERCEPTOR_H_
#define OPTSTEP_SERVER_RPC_REQUEST_PARSE_INTERCEPTOR_H_

// A server interceptor that answers a request whose bytes do not parse with INVALID_ARGUMENT.
//
// gRPC's callback API parses the request of a unary or server-streaming call before the service
// sees it, and when the bytes are no message of the method's request type it finishes the call
// with UNIMPLEMENTED and no message, as if the method did not exist. The caller sent a bad
// argument: this interceptor notes that the request did not parse and rewrites that status to
// INVALID_ARGUMENT "<method>: the request does not parse as <request type>".

#include <grpcpp/support/server_interceptor.h>

#include <memory>

namespace optstep {

// A factory for ServerBuilder::experimental().SetInterceptorCreators; list it before the
// interceptors that log or count final statuses, so that they see the rewritten one.
// The interceptors are thread-compatible, one per call.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRequestParseInterceptorFactory();

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_REQUEST_PARSE_INTERCEPTOR_H_
