// Roles under mutual TLS without tokens, through a real group of two ranks: the ranks, whose
// certificate names the peer role by default, form the group and step together; a trainer's
// certificate is a user, refused the ranks' own services and the admin calls (PERMISSION_DENIED
// naming the method, the role and the certificate's common name); an --admin_subjects
// certificate saves and sees every session; an owner closes her own session, another user gets
// NOT_FOUND for it.

#include <grpcpp/create_channel.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/internal.pb.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/unary_call.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::TestPki;

// Calls a unary `method` with `request` over mutual TLS as the holder of `cert` / `key`.
grpc::Status Unary(const std::string& target, const TestPki& pki, const std::string& cert,
                   const std::string& key, const std::string& method,
                   const google::protobuf::Message& request) {
  return testutil::UnaryCall(
      grpc::CreateChannel(target, testutil::MutualTlsCredentials(pki.ca, cert, key)), method,
      request);
}

class MtlsRolesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testutil::TestTmpDir();
    OPTSTEP_ASSERT_OK_AND_ASSIGN(pki_, testutil::MakeTestPki(dir, "mtls"));
    const std::string checkpoints = dir + "/mtls-checkpoints";
    std::filesystem::create_directories(checkpoints);
    // No --peer_subjects: the ranks' own certificate (CN mtls-server) is the peer.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        group_,
        testutil::StartGroup(2, {"--tls_cert=" + pki_.server_cert, "--tls_key=" + pki_.server_key,
                                 "--tls_client_ca=" + pki_.ca, "--admin_subjects=mtls-admin",
                                 "--checkpoint_root=" + checkpoints}));
    for (const auto& rank : group_) targets_.push_back(rank->address());
  }

  std::unique_ptr<Client> Connect(const std::string& cert, const std::string& key) {
    ClientOptions options;
    options.tls = true;
    options.tls_ca_file = pki_.ca;
    options.tls_cert_file = cert;
    options.tls_key_file = key;
    options.rank_targets = targets_;
    options.connect_timeout = absl::Seconds(20);
    auto client = Client::Connect(options);
    EXPECT_THAT(client.status(), IsOk());
    return client.ok() ? *std::move(client) : nullptr;
  }

  TestPki pki_;
  std::vector<std::unique_ptr<testutil::ServerProcess>> group_;
  std::vector<std::string> targets_;
};

TEST_F(MtlsRolesTest, CertificatesNameTheRoles) {
  std::unique_ptr<Client> trainer = Connect(pki_.client_cert, pki_.client_key);
  std::unique_ptr<Client> admin = Connect(pki_.admin_cert, pki_.admin_key);
  std::unique_ptr<Client> other = Connect(pki_.other_cert, pki_.other_key);
  ASSERT_TRUE(trainer && admin && other);
  // The ranks accept each other's peer calls: rank 1 joins through the rendezvous, both build
  // their replicas and step together.
  ASSERT_THAT(testutil::WaitServing(*trainer), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SmallSpec("mine")));
  const std::string id = info.session_id();
  ASSERT_THAT(StepSmall(*trainer, id, 1).status(), IsOk());
  ASSERT_THAT(StepSmall(*trainer, id, 2).status(), IsOk());

  // The trainer's certificate is a user's: not the ranks' own services, not the admin calls.
  v1::CloseReplicaRequest close_replica;
  close_replica.set_session_id(id);
  const grpc::Status replica = Unary(targets_[1], pki_, pki_.client_cert, pki_.client_key,
                                     "/optstep.v1.PeerService/CloseReplica", close_replica);
  EXPECT_EQ(replica.error_code(), grpc::StatusCode::PERMISSION_DENIED) << replica.error_message();
  EXPECT_EQ(replica.error_message(),
            "/optstep.v1.PeerService/CloseReplica needs a peer certificate; the certificate of "
            "'mtls-client' has the user role");
  v1::RendezvousSetRequest set;
  set.set_key("mtls-probe");
  set.set_value("x");
  EXPECT_EQ(Unary(targets_[0], pki_, pki_.client_cert, pki_.client_key,
                  "/optstep.v1.RendezvousService/Set", set)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(trainer->Save(id, "by-trainer").status(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       "/optstep.v1.CheckpointService/Save needs an admin certificate; the "
                       "certificate of 'mtls-client' has the user role"));
  EXPECT_THAT(trainer->Shutdown(0), StatusIs(absl::StatusCode::kPermissionDenied, "mtls-client"));
  // Nor is the admin's certificate a peer's.
  EXPECT_EQ(Unary(targets_[1], pki_, pki_.admin_cert, pki_.admin_key,
                  "/optstep.v1.PeerService/CloseReplica", close_replica)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // The refused CloseReplica broke nothing: the session steps on both ranks.
  ASSERT_THAT(StepSmall(*trainer, id, 3).status(), IsOk());

  // The --admin_subjects certificate sees the trainer's session and saves it.
  auto seen = admin->GetSession(id);
  ASSERT_THAT(seen.status(), IsOk());
  EXPECT_EQ(seen->step(), 3u);
  auto saved = admin->Save(id, "by-admin");
  ASSERT_THAT(saved.status(), IsOk());
  EXPECT_EQ(saved->step(), 3u);

  // Another user's certificate: the session does not exist for it, and it cannot close it.
  EXPECT_THAT(other->GetSession(id).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(other->CloseSession(id), StatusIs(absl::StatusCode::kNotFound, id));
  ASSERT_THAT(StepSmall(*trainer, id, 4).status(), IsOk());

  // The owner closes her own session.
  EXPECT_THAT(trainer->CloseSession(id), IsOk());
  EXPECT_THAT(trainer->GetSession(id).status(), StatusIs(absl::StatusCode::kNotFound));
  auto left = admin->ListSessions();
  ASSERT_THAT(left.status(), IsOk());
  EXPECT_TRUE(left->empty());
}
}  // namespace
}  // namespace optstep
