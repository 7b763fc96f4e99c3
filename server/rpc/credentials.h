#ifndef OPTSTEP_SERVER_RPC_CREDENTIALS_H_
#define OPTSTEP_SERVER_RPC_CREDENTIALS_H_

// TLS for the rank's port and for its calls to the other ranks
// (docs/security.md). Every file is read once, at start.

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

struct TlsFiles {
  // PEM certificate chain and private key of this rank: served on its port, and
  // presented as the client certificate when it calls the other ranks. Both
  // empty: no TLS.
  std::string cert_file;
  std::string key_file;
  // Set: every client must present a certificate signed by this CA (mutual
  // TLS).
  std::string client_ca_file;
  // CA that signed the other ranks' certificates, to verify them when calling
  // them. Empty: the client CA, else the system's roots.
  std::string ca_file;

  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// The whole content of a PEM file. NOT_FOUND naming `what` and the path when
// unreadable, INVALID_ARGUMENT when it holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what);

// The common name (CN) of the first certificate in the PEM file `path`: how the other ranks see
// this rank under mutual TLS. NOT_FOUND when unreadable, INVALID_ARGUMENT naming the path when it
// holds no certificate or the certificate's subject has no common name.
absl::StatusOr<std::string> CertificateCommonName(const std::string& path);

// Insecure credentials without TLS (and then `processor` must be null:
// INVALID_ARGUMENT, since gRPC would silently skip it); TLS credentials (client
// certificates required and verified with a client CA) running `processor` on
// every call otherwise.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor);

// What this rank uses to call the other ranks: TLS with its own certificate as
// client certificate, plus `token` as bearer token when non-empty; insecure
// without TLS.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakePeerCredentials(
    const TlsFiles& tls, const std::string& token);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CREDENTIALS_H_
