// The common name a rank reads from its own certificate: the default peer subject under mutual
// TLS without tokens.

#include "server/rpc/credentials.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/integration/test_pki.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// Subject "/O=optstep/CN=rank-shared".
constexpr char kWithCommonName[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBpzCCAU2gAwIBAgIUPZSf7/W9Sm5oAokbb1gOA2oSCsUwCgYIKoZIzj0EAwIw\n"
    "KDEQMA4GA1UECgwHb3B0c3RlcDEUMBIGA1UEAwwLcmFuay1zaGFyZWQwIBcNMjYx\n"
    "MjAzMjM1MjAzWhgPMjEyNjExMDkyMzUyMDNaMCgxEDAOBgNVBAoMB29wdHN0ZXAx\n"
    "FDASBgNVBAMMC3Jhbmstc2hhcmVkMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n"
    "S/6TRCCZmX/iCNiUfUowTDEklW8lsABXg2guLAz0DP2os1pbSkymQw0lgTdoWJgm\n"
    "pt1K0VJ9MXzgb68GpPHPXKNTMFEwHQYDVR0OBBYEFFSIEIJV4vmGGX8OQue7bozC\n"
    "oTWyMB8GA1UdIwQYMBaAFFSIEIJV4vmGGX8OQue7bozCoTWyMA8GA1UdEwEB/wQF\n"
    "MAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgTeOL0ViG/XyLGCBWT0AcibUvLQINZ4Rg\n"
    "NbmZCcnquJ4CIQD0+6ypOvU9InyrUlb4jlE4Y4ZRI/dedOHRn6Pzjq+pCA==\n"
    "-----END CERTIFICATE-----\n";
// Subject "/O=optstep": no common name.
constexpr char kWithoutCommonName[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBezCCASGgAwIBAgIUCU9NdS9B5JaMl7G8Y4V5jxbYWZowCgYIKoZIzj0EAwIw\n"
    "EjEQMA4GA1UECgwHb3B0c3RlcDAgFw0yNjEyMDMyMzUyMDNaGA8yMTI2MTEwOTIz\n"
    "NTIwM1owEjEQMA4GA1UECgwHb3B0c3RlcDBZMBMGByqGSM49AgEGCCqGSM49AwEH\n"
    "A0IABCQHyMOuiXKDa/PmtSwMNK/zNmIY0ZGoHAhnppbmu9YH4Gxa3mG/itXCtEZL\n"
    "4dh7kr4UCxsfpRdDKaamLZ5QBDSjUzBRMB0GA1UdDgQWBBTieVDuEP+lv48ihEck\n"
    "6QWcLGGcTzAfBgNVHSMEGDAWgBTieVDuEP+lv48ihEck6QWcLGGcTzAPBgNVHRMB\n"
    "Af8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIDd5Z1WW54q6O4uLfrH2rdWK/J02\n"
    "JbwDYieDQU95HxxUAiEAlVqOYICPPhsBhcO8P/mDrpsn8/EQHpg8CqHq5MvnBqA=\n"
    "-----END CERTIFICATE-----\n";

std::string Write(const std::string& name, const std::string& text) {
  return testutil::WriteTestFile(testutil::TestTmpDir(), name, text);
}

TEST(CertificateCommonNameTest, ReadsTheSubjectsCommonName) {
  const absl::StatusOr<std::string> name = CertificateCommonName(Write("cn.pem", kWithCommonName));
  ASSERT_THAT(name.status(), IsOk());
  EXPECT_EQ(*name, "rank-shared");
}

TEST(CertificateCommonNameTest, RefusesNamingThePath) {
  const std::string no_cn = Write("no-cn.pem", kWithoutCommonName);
  EXPECT_THAT(CertificateCommonName(no_cn).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "TLS certificate '" + no_cn + "' has no subject common name (CN)"));
  const std::string garbled =
      Write("garbled.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  EXPECT_THAT(CertificateCommonName(garbled).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds no readable X.509 certificate"));
  EXPECT_THAT(CertificateCommonName(Write("text.pem", "not pem")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "holds no PEM block"));
  EXPECT_THAT(CertificateCommonName("/nonexistent/cert.pem").status(),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/cert.pem"));
}

}  // namespace
}  // namespace optstep
