#include "server/rpc/credentials.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::string> ReadPemFile(const std::string &path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' holds no PEM block (-----BEGIN ...)"));
  }
  return text.str();
}

namespace {

absl::Status CheckPair(const TlsFiles &tls) {
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs both a certificate and a key; got certificate '", tls.cert_file,
                     "' and key '", tls.key_file, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles &tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor) {
  if (!tls.enabled()) {
    if (processor != nullptr) {
      return absl::InvalidArgumentError(
          "bearer tokens need TLS (gRPC checks call metadata only on TLS "
          "connections): set a "
          "certificate and key");
    }
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client CA '", tls.client_ca_file, "' given without a certificate and key"));
    }
    return grpc::InsecureServerCredentials();
  }
  OPTSTEP_RETURN_IF_ERROR(CheckPair(tls));
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  OPTSTEP_ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(tls.cert_file, "TLS certificate"));
  OPTSTEP_ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(tls.key_file, "TLS key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    OPTSTEP_ASSIGN_OR_RETURN(options.pem_root_certs,
                             ReadPemFile(tls.client_ca_file, "TLS client CA"));
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (processor != nullptr) credentials->SetAuthMetadataProcessor(std::move(processor));
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakePeerCredentials(
    const TlsFiles &tls, const std::string &token) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  OPTSTEP_RETURN_IF_ERROR(CheckPair(tls));
  grpc::SslCredentialsOptions options;
  const std::string &ca = tls.ca_file.empty() ? tls.client_ca_file : tls.ca_file;
  if (!ca.empty()) {
    OPTSTEP_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(ca, "TLS CA"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile(tls.cert_file, "TLS certificate"));
  OPTSTEP_ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile(tls.key_file, "TLS key"));
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(token));
}

}  // namespace optstep
