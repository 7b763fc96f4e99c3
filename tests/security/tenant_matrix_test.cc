// Tenant isolation through a real group of two ranks with mutual TLS and named tokens: every RPC
// as the session's owner, another user, an admin, a peer and a caller without credentials, one
// expected code per cell. Another user learns nothing of the owner's session (NOT_FOUND exactly as
// for an id that does not exist; ListSessions does not list it; names are scoped per owner) and
// changes nothing of it (the owner's parameters and step stay bit-identical); a peer secret opens
// only the ranks' own services, and an admin token none of them.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <sys/wait.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
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
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::TestPki;
using ::testing::HasSubstr;
using ::testing::Not;
using Code = absl::StatusCode;
// A cell run after the table, since it changes the state the table checks.
constexpr Code kLater = Code::kUnknown;

constexpr char kAliceSecret[] = "alice-secret-4f1d9c2b7e60";
constexpr char kBobSecret[] = "bob-secret-0a8e3f5d1c92b";
constexpr char kRootSecret[] = "root-secret-7c2e9b41d0f3";
constexpr char kPeerSecret[] = "peer-secret-93b0e6a1f7d4";

// The callers of the matrix, in its column order.
enum Who { kOwner, kOther, kAdmin, kPeer, kNone, kWhoCount };
const char* const kWhoNames[] = {"owner", "other user", "admin", "peer", "no credentials"};
const char* const kSecrets[] = {kAliceSecret, kBobSecret, kRootSecret, kPeerSecret, ""};

// Calls a unary `method` with `request` through `channel`.
absl::StatusCode Unary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const google::protobuf::Message& request) {
  return static_cast<absl::StatusCode>(testutil::UnaryCall(channel, method, request).error_code());
}

class TenantMatrixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testutil::TestTmpDir();
    OPTSTEP_ASSERT_OK_AND_ASSIGN(pki_, testutil::MakeTestPki(dir, "tenants"));
    const std::string tokens = testutil::WriteTestFile(
        dir, "tokens",
        absl::StrCat("alice user ", kAliceSecret, "\nbob user ", kBobSecret, "\nroot admin ",
                     kRootSecret, "\nranks peer ", kPeerSecret, "\n"));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        group_,
        testutil::StartGroup(2, {"--tls_cert=" + pki_.server_cert, "--tls_key=" + pki_.server_key,
                                 "--tls_client_ca=" + pki_.ca, "--auth_tokens_file=" + tokens}));
    for (int who = 0; who < kWhoCount; ++who) {
      ClientOptions options;
      options.tls = true;
      options.tls_ca_file = pki_.ca;
      options.tls_cert_file = pki_.client_cert;
      options.tls_key_file = pki_.client_key;
      options.token = kSecrets[who];
      for (const auto& rank : group_) options.rank_targets.push_back(rank->address());
      options.connect_timeout = absl::Seconds(20);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(clients_[who], Client::Connect(options));
      std::shared_ptr<grpc::ChannelCredentials> credentials =
          testutil::MutualTlsCredentials(pki_.ca, pki_.client_cert, pki_.client_key);
      if (who != kNone) {
        credentials = grpc::CompositeChannelCredentials(
            credentials, grpc::AccessTokenCredentials(kSecrets[who]));
      }
      for (size_t r = 0; r < group_.size(); ++r) {
        channels_[who].push_back(grpc::CreateChannel(group_[r]->address(), credentials));
      }
    }
    ASSERT_THAT(testutil::WaitServing(*clients_[kOwner]), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(victim_, clients_[kOwner]->CreateSession(SmallSpec("victim")));
    ASSERT_THAT(StepSmall(*clients_[kOwner], victim_.session_id(), 1).status(), IsOk());
  }

  // The owner's view of the victim: step and every parameter value, bit for bit.
  std::pair<uint64_t, std::vector<float>> OwnerView() {
    std::pair<uint64_t, std::vector<float>> view;
    auto info = clients_[kOwner]->GetSession(victim_.session_id());
    EXPECT_THAT(info.status(), IsOk());
    if (info.ok()) view.first = info->step();
    auto params = clients_[kOwner]->PullParameters(victim_.session_id(), DType::kF32);
    EXPECT_THAT(params.status(), IsOk());
    if (!params.ok()) return view;
    for (const auto& [id, p] : params->params) {
      view.second.insert(view.second.end(), p.f32.begin(), p.f32.end());
    }
    return view;
  }

  TestPki pki_;
  std::vector<std::unique_ptr<testutil::ServerProcess>> group_;
  std::unique_ptr<Client> clients_[kWhoCount];
  std::vector<std::shared_ptr<grpc::Channel>> channels_[kWhoCount];
  v1::SessionInfo victim_;
};

struct Row {
  std::string rpc;
  // The call as `who`; answers its code.
  std::function<Code(int who)> call;
  Code expected[kWhoCount];
};

TEST_F(TenantMatrixTest, EveryRpcAnswersEachCallerAsTheTableSaysAndNoTenantSeesAnother) {
  const std::string id = victim_.session_id();
  const auto before = OwnerView();
  const Code OK = Code::kOk, NF = Code::kNotFound, PD = Code::kPermissionDenied,
             UN = Code::kUnauthenticated, FP = Code::kFailedPrecondition;
  Client::StateDictEntry entry;
  entry.key = "param/fc.bias";
  entry.shape = {8};
  entry.bytes = std::string(8 * sizeof(float), '\0');
  // Cells marked kLater change state when allowed: they run after the comparison below.
  const std::vector<Row> rows = {
      {"GetSession",
       [&](int who) { return clients_[who]->GetSession(id).status().code(); },
       {OK, NF, OK, PD, UN}},
      {"ListSessions",
       [&](int who) { return clients_[who]->ListSessions().status().code(); },
       {OK, OK, OK, PD, UN}},
      {"PullParameters",
       [&](int who) { return clients_[who]->PullParameters(id, DType::kF32).status().code(); },
       {OK, NF, OK, PD, UN}},
      {"ExportStateDict",
       [&](int who) {
         v1::ExportStateDictRequest request;
         request.set_session_id(id);
         return clients_[who]->ExportStateDict(request).status().code();
       },
       {OK, NF, OK, PD, UN}},
      // Only before the first step: the owner and the admin get past the owner check to the
      // session's own answer.
      {"InitParameters",
       [&](int who) {
         return clients_[who]->InitParameters(id, 1, std::vector<float>(8, 0.f)).code();
       },
       {FP, NF, FP, PD, UN}},
      // The raw Step stream checks the owner itself, on the rank that owns the parameter.
      {"Step (stream to rank 1)",
       [&](int who) {
         return static_cast<Code>(
             testutil::OpenStep::TryBegin(channels_[who][1], id, 5).error_code());
       },
       {FP, NF, FP, PD, UN}},
      // A segment of the owner's session (SHARDED: refused as such): only the owner and an
      // admin get past the owner check to the session's own answer.
      {"AttachSharedMemory",
       [&](int who) {
         v1::AttachSharedMemoryRequest request;
         request.set_session_id(id);
         return Unary(channels_[who][1], "/optstep.v1.OptimizerService/AttachSharedMemory",
                      request);
       },
       {FP, NF, FP, PD, UN}},
      {"Save",
       [&](int who) { return clients_[who]->Save(id, "stolen").status().code(); },
       {PD, PD, FP, PD, UN}},
      {"Load",
       [&](int who) { return clients_[who]->Load(id, "stolen").status().code(); },
       {PD, PD, FP, PD, UN}},
      {"ImportStateDict",
       [&](int who) {
         return clients_[who]->ImportStateDict(id, {&entry, 1}).code();
       },
       {PD, PD, kLater, PD, UN}},
      // Owners close their own sessions.
      {"CloseSession",
       [&](int who) { return clients_[who]->CloseSession(id).code(); },
       {kLater, NF, kLater, PD, UN}},
      {"Shutdown",
       [&](int who) { return clients_[who]->Shutdown(0).code(); },
       {PD, PD, kLater, PD, UN}},
      {"PeerService/CloseReplica",
       [&](int who) {
         v1::CloseReplicaRequest request;
         request.set_session_id(who == kPeer ? "s-none" : id);  // a peer may; spare the victim
         return Unary(channels_[who][1], "/optstep.v1.PeerService/CloseReplica", request);
       },
       {PD, PD, PD, NF, UN}},
      {"PeerService/Ping",
       [&](int who) {
         return Unary(channels_[who][1], "/optstep.v1.PeerService/Ping", v1::PingRequest());
       },
       {PD, PD, PD, OK, UN}},
      {"RendezvousService/Set",
       [&](int who) {
         v1::RendezvousSetRequest request;
         request.set_key("tenant-matrix-probe");
         request.set_value("x");
         return Unary(channels_[who][0], "/optstep.v1.RendezvousService/Set", request);
       },
       {PD, PD, PD, OK, UN}},
  };
  for (const Row& row : rows) {
    for (int who = 0; who < kWhoCount; ++who) {
      if (row.expected[who] == kLater) continue;
      EXPECT_EQ(row.call(who), row.expected[who]) << row.rpc << " as " << kWhoNames[who];
    }
  }

  // Nothing revealed: the other user's NOT_FOUND is the one of an id that does not exist, and
  // its list holds nothing of the owner's.
  const absl::Status hidden = clients_[kOther]->GetSession(id).status();
  const std::string unknown = "s0123456789abcdef0123456789abcdef";
  const absl::Status missing = clients_[kOwner]->GetSession(unknown).status();
  EXPECT_EQ(hidden.message(), absl::StrReplaceAll(missing.message(), {{unknown, id}}));
  auto listed = clients_[kOther]->ListSessions();
  ASSERT_THAT(listed.status(), IsOk());
  EXPECT_TRUE(listed->empty());
  auto all = clients_[kAdmin]->ListSessions();
  ASSERT_THAT(all.status(), IsOk());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(all->front().session_id(), id);
  // Nothing changed.
  EXPECT_EQ(OwnerView(), before) << "another caller changed the owner's session";

  // Names are scoped per owner: the other user's "victim" is a session of its own.
  bool attached = true;
  auto own = clients_[kOther]->CreateSession(SmallSpec("victim"), &attached);
  ASSERT_THAT(own.status(), IsOk());
  EXPECT_FALSE(attached);
  EXPECT_NE(own->session_id(), id);
  auto again = clients_[kOwner]->CreateSession(SmallSpec("victim"), &attached);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_TRUE(attached);
  EXPECT_EQ(again->session_id(), id);
  listed = clients_[kOwner]->ListSessions();
  ASSERT_THAT(listed.status(), IsOk());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().session_id(), id);
  EXPECT_THAT(clients_[kOther]->GetSession(id).status().message(), Not(HasSubstr("alice")));

  // The cells that change state: the owner and the admin step the session, the owner closes it,
  // the admin closes the other user's and shuts the group down.
  EXPECT_THAT(StepSmall(*clients_[kOwner], id, 2).status(), IsOk());
  EXPECT_THAT(StepSmall(*clients_[kAdmin], id, 3).status(), IsOk());
  EXPECT_THAT(clients_[kOwner]->CloseSession(id), IsOk());
  EXPECT_EQ(clients_[kOwner]->GetSession(id).status().code(), NF);
  EXPECT_THAT(clients_[kOther]->GetSession(own->session_id()).status(), IsOk());
  EXPECT_THAT(clients_[kAdmin]->CloseSession(own->session_id()), IsOk());
  EXPECT_EQ(clients_[kOther]->GetSession(own->session_id()).status().code(), NF);
  EXPECT_THAT(clients_[kAdmin]->Shutdown(0), IsOk());
  const int status = group_[0]->Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace optstep
