#ifndef OPTSTEP_CLIENT_CPP_CHANNEL_OPTIONS_H_
#define OPTSTEP_CLIENT_CPP_CHANNEL_OPTIONS_H_

// gRPC channel arguments from ClientOptions: message size limits and the HTTP/2 flow-control
// settings that docs/design.md §4 measured (BDP probe off, large stream window, large frames).
// Internal to client/.

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/client_options.h"

namespace optstep {
namespace client_internal {

// INVALID_ARGUMENT for a missing target, an out-of-range size (frame size outside the HTTP/2
// range [16384, 16777215], chunk size outside [4, 4 MiB], a message size that cannot hold a full
// chunk), a non-positive timeout, a token or TLS file without `tls`, or a client certificate
// without its key (or the reverse).
absl::Status ValidateClientOptions(const ClientOptions& options);

// REQUIRES: ValidateClientOptions(options).ok().
grpc::ChannelArguments MakeChannelArguments(const ClientOptions& options);

// Insecure, or TLS (with a client certificate) plus the bearer token. NOT_FOUND naming an
// unreadable file. REQUIRES: ValidateClientOptions(options).ok().
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientOptions& options);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_CHANNEL_OPTIONS_H_
