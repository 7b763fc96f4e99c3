#ifndef OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_
#define OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_

// Throwaway certificates for TLS tests, made with the `openssl` command at test time: a CA, a
// server certificate for 127.0.0.1 / localhost and three client certificates, all signed by that
// CA. The common name of each certificate is `<name>-<who>` (who: server, client, admin, other).

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace optstep {
namespace testutil {

struct TestPki {
  std::string ca;  // PEM files
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
  // Two more client certificates, for a second role or a second tenant under mutual TLS.
  std::string admin_cert;
  std::string admin_key;
  std::string other_cert;
  std::string other_key;
};

// Writes the files under `dir`/`name` (created). INTERNAL with openssl's output when it fails.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir, const std::string& name);

// Client credentials of mutual TLS from PEM files: trust `ca`, present `cert` / `key`.
std::shared_ptr<grpc::ChannelCredentials> MutualTlsCredentials(const std::string& ca,
                                                               const std::string& cert,
                                                               const std::string& key);

// $TEST_TMPDIR (or /tmp).
std::string TestTmpDir();

// Writes `text` to `dir`/`name` and answers the path.
std::string WriteTestFile(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_
