#ifndef OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_
#define OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_

// Throwaway certificates for TLS tests, made with the `openssl` command at test time: a CA, a
// server certificate for 127.0.0.1 / localhost and a client certificate, all signed by that CA.

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
};

// Writes the files under `dir`/`name` (created). INTERNAL with openssl's output when it fails.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir, const std::string& name);

// $TEST_TMPDIR (or /tmp).
std::string TestTmpDir();

// Writes `text` to `dir`/`name` and answers the path.
std::string WriteTestFile(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_TEST_PKI_H_
