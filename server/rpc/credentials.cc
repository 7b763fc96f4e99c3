#include "server/rpc/credentials.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what) {
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

absl::StatusOr<std::string> CertificateCommonName(const std::string& path) {
  OPTSTEP_ASSIGN_OR_RETURN(const std::string pem, ReadPemFile(path, "TLS certificate"));
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), pem.size()), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr),
      &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate '", path, "' holds no readable X.509 certificate"));
  }
  const X509_NAME* subject = X509_get_subject_name(cert.get());
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  const ASN1_STRING* name =
      index < 0 ? nullptr : X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  unsigned char* utf8 = nullptr;
  const int length = name == nullptr ? -1 : ASN1_STRING_to_UTF8(&utf8, name);
  if (length <= 0) {
    OPENSSL_free(utf8);
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate '", path, "' has no subject common name (CN)"));
  }
  std::string common_name(reinterpret_cast<const char*>(utf8), length);
  OPENSSL_free(utf8);
  return common_name;
}

namespace {

absl::Status CheckPair(const TlsFiles& tls) {
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs both a certificate and a key; got certificate '", tls.cert_file,
                     "' and key '", tls.key_file, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, std::shared_ptr<grpc::AuthMetadataProcessor> processor) {
  if (!tls.enabled()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client CA '", tls.client_ca_file, "' given without a certificate and key"));
    }
    if (processor != nullptr) {
      return absl::InvalidArgumentError(
          "bearer tokens need TLS (gRPC checks call metadata only on TLS "
          "connections): set a "
          "certificate and key");
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
    const TlsFiles& tls, const std::string& token) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  OPTSTEP_RETURN_IF_ERROR(CheckPair(tls));
  grpc::SslCredentialsOptions options;
  const std::string& ca = tls.ca_file.empty() ? tls.client_ca_file : tls.ca_file;
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
