#ifndef OPTSTEP_TESTS_TESTING_UNARY_CALL_H_
#define OPTSTEP_TESTS_TESTING_UNARY_CALL_H_

// Any unary method of a server called with one request message, for tests of what the server
// answers before a handler runs (credentials, roles): the caller needs no stub of the service.
// Thread-compatible: a free function over a channel, which may be shared.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "google/protobuf/message.h"

namespace optstep {
namespace testutil {

// Calls `method` ("/optstep.v1.PeerService/CloseReplica") with `request`, sending `token` as
// `authorization: Bearer <token>` unless empty, with a deadline of 20 s; answers the call's status
// (the response is dropped).
grpc::Status UnaryCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const google::protobuf::Message& request, const std::string& token = "");
// The same with the request's bytes as given (they need not parse), with a deadline of 20 s.
grpc::Status UnaryCallBytes(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& bytes,
                            const std::string& token = "");

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_UNARY_CALL_H_
