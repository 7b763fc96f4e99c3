#include "tests/integration/test_pki.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace testutil {
namespace {

// P-256 keys: quick to make, and every TLS stack gRPC may use accepts them.
constexpr const char* kKey = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string WriteTestFile(const std::string& dir, const std::string& name,
                          const std::string& text) {
  const std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << text;
  return path;
}

std::shared_ptr<grpc::ChannelCredentials> MutualTlsCredentials(const std::string& ca,
                                                               const std::string& cert,
                                                               const std::string& key) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(ca);
  ssl.pem_cert_chain = ReadAll(cert);
  ssl.pem_private_key = ReadAll(key);
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir, const std::string& name) {
  const std::string d = absl::StrCat(dir, "/", name);
  WriteTestFile(dir, name + ".ext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "basicConstraints=CA:FALSE\n");
  const std::string log = absl::StrCat(d, ".log");
  const std::string script = absl::StrCat(
      "set -e; mkdir -p ", d, "; cd ", d, "; ", "openssl req -x509 ", kKey,
      " -days 2 -subj /CN=", name, "-test-ca -keyout ca.key -out ca.pem; ",
      "for who in server client admin other; do ", "openssl req ", kKey, " -subj /CN=", name,
      "-$who -keyout $who.key -out $who.csr; ",
      "openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 ",
      "-extfile ../", name, ".ext -out $who.pem; done");
  const int rc = std::system(absl::StrCat("bash -c '", script, "' > ", log, " 2>&1").c_str());
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("openssl failed (", rc, "): ", ReadAll(log)));
  }
  TestPki pki;
  pki.ca = d + "/ca.pem";
  pki.server_cert = d + "/server.pem";
  pki.server_key = d + "/server.key";
  pki.client_cert = d + "/client.pem";
  pki.client_key = d + "/client.key";
  pki.admin_cert = d + "/admin.pem";
  pki.admin_key = d + "/admin.key";
  pki.other_cert = d + "/other.pem";
  pki.other_key = d + "/other.key";
  return pki;
}

}  // namespace testutil
}  // namespace optstep
