// TLS, mutual TLS and bearer tokens through the real server: every RPC refuses a call without
// a token, with an unknown token, with a user token where an admin one is needed, and over a
// connection whose certificates the server does not trust, and none of these calls changes any
// state. Health stays open for probes. A group of two ranks with TLS and tokens still steps.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/admin_service.pb.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "optstep/v1/internal.pb.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/unary_call.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::MakeTestPki;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::TestPki;
using ::testing::HasSubstr;

constexpr char kUserToken[] = "user-token-5f0c2b7e9a41";
constexpr char kAdminToken[] = "admin-token-d83a6e1f27c9";
constexpr char kPeerToken[] = "peer-token-7b1e04c9d2a6";
constexpr char kWrongToken[] = "wrong-token-000000000000";

std::vector<std::string> ServerFlags(const TestPki& pki, const std::string& tokens_file) {
  return {"--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
          "--tls_client_ca=" + pki.ca, "--auth_tokens_file=" + tokens_file};
}

ClientOptions TlsOptions(const TestPki& pki, const std::string& target, const std::string& token) {
  ClientOptions options;
  options.target = target;
  options.tls = true;
  options.tls_ca_file = pki.ca;
  options.tls_cert_file = pki.client_cert;
  options.tls_key_file = pki.client_key;
  options.token = token;
  return options;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target, const TestPki& trusted,
                                       const TestPki& identity) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a fresh handshake per channel
  return grpc::CreateCustomChannel(
      target, testutil::MutualTlsCredentials(trusted.ca, identity.client_cert, identity.client_key),
      args);
}

// Calls `method` with one request message (any method: gRPC checks the credentials before the
// handler sees a message), `token` as bearer token unless empty.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const google::protobuf::Message& request, const std::string& token) {
  return testutil::UnaryCall(channel, method, request, token);
}

// Everything a refused call could have changed: sessions, their steps and parameter values.
struct Snapshot {
  std::map<std::string, uint64_t> steps;
  std::map<std::string, std::vector<float>> values;
  bool operator==(const Snapshot& o) const { return steps == o.steps && values == o.values; }
};

Snapshot Take(Client& admin) {
  Snapshot snapshot;
  auto sessions = admin.ListSessions();
  EXPECT_THAT(sessions.status(), IsOk());
  if (!sessions.ok()) return snapshot;
  for (const v1::SessionSummary& info : *sessions) {
    snapshot.steps[info.session_id()] = info.step();
    auto params = admin.PullParameters(info.session_id(), DType::kF32);
    EXPECT_THAT(params.status(), IsOk());
    if (!params.ok()) continue;
    for (const auto& [id, p] : params->params) {
      auto& v = snapshot.values[info.session_id()];
      v.insert(v.end(), p.f32.begin(), p.f32.end());
    }
  }
  return snapshot;
}

struct Rpc {
  std::string method;
  std::shared_ptr<google::protobuf::Message> request;
  // "user", "admin" or "peer": the role the call needs.
  std::string needs;
};

// Every RPC of the server, each with a request that would change state (or read it) if the
// server let it through.
std::vector<Rpc> AllRpcs(const std::string& session_id) {
  auto create = std::make_shared<v1::CreateSessionRequest>();
  *create->mutable_spec() = SmallSpec("intruder");
  auto get = std::make_shared<v1::GetSessionRequest>();
  get->set_session_id(session_id);
  auto close = std::make_shared<v1::CloseSessionRequest>();
  close->set_session_id(session_id);
  auto init = std::make_shared<v1::InitParametersRequest>();
  init->set_session_id(session_id);
  init->mutable_values()->set_param_id(1);
  init->mutable_values()->set_dtype(v1::DTYPE_FP32);
  init->mutable_values()->set_data(std::string(8 * sizeof(float), '\0'));
  auto step = std::make_shared<v1::StepRequest>();
  step->mutable_header()->set_session_id(session_id);
  step->mutable_header()->set_step(2);
  auto pull = std::make_shared<v1::PullParametersRequest>();
  pull->set_session_id(session_id);
  auto save = std::make_shared<v1::SaveRequest>();
  save->set_session_id(session_id);
  save->set_name("stolen");
  auto load = std::make_shared<v1::LoadRequest>();
  load->set_session_id(session_id);
  load->set_name("stolen");
  auto export_request = std::make_shared<v1::ExportStateDictRequest>();
  export_request->set_session_id(session_id);
  auto import = std::make_shared<v1::StateDictChunk>();
  import->set_session_id(session_id);
  import->set_key("param/fc.bias");
  import->add_shape(8);
  import->set_dtype(v1::DTYPE_FP32);
  import->set_data(std::string(8 * sizeof(float), '\0'));
  auto close_replica = std::make_shared<v1::CloseReplicaRequest>();
  close_replica->set_session_id(session_id);
  auto rendezvous = std::make_shared<v1::RendezvousSetRequest>();
  return {
      {"/optstep.v1.OptimizerService/CreateSession", create, "user"},
      {"/optstep.v1.OptimizerService/GetSession", get, "user"},
      {"/optstep.v1.OptimizerService/ListSessions", std::make_shared<v1::ListSessionsRequest>(),
       "user"},
      {"/optstep.v1.OptimizerService/CloseSession", close, "user"},
      {"/optstep.v1.OptimizerService/InitParameters", init, "user"},
      {"/optstep.v1.OptimizerService/Step", step, "user"},
      {"/optstep.v1.OptimizerService/PullParameters", pull, "user"},
      {"/optstep.v1.CheckpointService/Save", save, "admin"},
      {"/optstep.v1.CheckpointService/Load", load, "admin"},
      {"/optstep.v1.CheckpointService/ExportStateDict", export_request, "user"},
      {"/optstep.v1.CheckpointService/ImportStateDict", import, "admin"},
      {"/optstep.v1.PeerService/CloseReplica", close_replica, "peer"},
      {"/optstep.v1.RendezvousService/Set", rendezvous, "peer"},
      {"/optstep.v1.AdminService/Shutdown", std::make_shared<v1::ShutdownRequest>(), "admin"},
  };
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testutil::TestTmpDir();
    auto good = MakeTestPki(dir, "good");
    ASSERT_THAT(good.status(), IsOk());
    good_ = *good;
    auto other = MakeTestPki(dir, "other");
    ASSERT_THAT(other.status(), IsOk());
    other_ = *other;
    tokens_file_ = testutil::WriteTestFile(
        dir, "tokens",
        absl::StrCat("# name role secret\nalice user ", kUserToken, "\nroot admin ", kAdminToken,
                     "\nranks peer ", kPeerToken, "\n"));
  }

  TestPki good_;
  TestPki other_;
  std::string tokens_file_;
};

TEST_F(SecurityTest, EveryRpcRefusesMissingWrongAndUnderprivilegedCredentials) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start(ServerFlags(good_, tokens_file_)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto admin,
                               Client::Connect(TlsOptions(good_, server->address(), kAdminToken)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto user,
                               Client::Connect(TlsOptions(good_, server->address(), kUserToken)));
  // A user creates and steps a session; the state the refused calls must leave alone.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, user->CreateSession(SmallSpec("victim")));
  ASSERT_THAT(StepSmall(*user, info.session_id(), 1).status(), IsOk());
  const Snapshot before = Take(*admin);
  ASSERT_EQ(before.steps.size(), 1u);
  ASSERT_EQ(before.steps.at(info.session_id()), 1u);

  const auto trusted = Channel(server->address(), good_, good_);
  for (const Rpc& rpc : AllRpcs(info.session_id())) {
    SCOPED_TRACE(rpc.method);
    const grpc::Status none = Call(trusted, rpc.method, *rpc.request, "");
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_THAT(none.error_message(), HasSubstr("authorization"));
    const grpc::Status wrong = Call(trusted, rpc.method, *rpc.request, kWrongToken);
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong.error_message();
    if (rpc.needs != "user") {
      const grpc::Status denied = Call(trusted, rpc.method, *rpc.request, kUserToken);
      EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED) << denied.error_message();
      EXPECT_THAT(denied.error_message(), HasSubstr(absl::StrCat(rpc.needs, " token")));
    }
    // A client certificate from another CA, and a client that does not trust the server's CA:
    // the handshake fails before any call.
    const grpc::Status foreign_client =
        Call(Channel(server->address(), good_, other_), rpc.method, *rpc.request, kAdminToken);
    EXPECT_EQ(foreign_client.error_code(), grpc::StatusCode::UNAVAILABLE)
        << foreign_client.error_message();
    const grpc::Status foreign_server =
        Call(Channel(server->address(), other_, other_), rpc.method, *rpc.request, kAdminToken);
    EXPECT_EQ(foreign_server.error_code(), grpc::StatusCode::UNAVAILABLE)
        << foreign_server.error_message();
  }
  // Plaintext against a TLS port.
  const grpc::Status plain =
      Call(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()),
           "/optstep.v1.OptimizerService/ListSessions", v1::ListSessionsRequest(), kAdminToken);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();

  EXPECT_TRUE(Take(*admin) == before) << "a refused call changed the server's state";

  // The requests were real: the same CloseSession with an admin token closes the session.
  v1::CloseSessionRequest close;
  close.set_session_id(info.session_id());
  const grpc::Status closed =
      Call(trusted, "/optstep.v1.OptimizerService/CloseSession", close, kAdminToken);
  EXPECT_TRUE(closed.ok()) << closed.error_message();
  auto left = admin->ListSessions();
  ASSERT_THAT(left.status(), IsOk());
  EXPECT_TRUE(left->empty());

  // And an admin's Shutdown stops the server, which exits cleanly.
  const grpc::Status shut =
      Call(trusted, "/optstep.v1.AdminService/Shutdown", v1::ShutdownRequest(), kAdminToken);
  EXPECT_TRUE(shut.ok()) << shut.error_message();
  const int status = server->Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A caller refused before any handler names the method itself (the request's path): made-up
// methods count under one "other" series, so that a caller cannot add metric series without end.
TEST_F(SecurityTest, RefusedMadeUpMethodsAddOneMetricSeries) {
  std::vector<std::string> flags = ServerFlags(good_, tokens_file_);
  flags.push_back("--metrics_port=-1");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start(flags));
  const auto trusted = Channel(server->address(), good_, good_);
  constexpr int kMadeUp = 50;
  for (int i = 0; i < kMadeUp; ++i) {
    const grpc::Status refused =
        Call(trusted, absl::StrCat("/made.Up/Method", i, "\n\x01"), v1::ListSessionsRequest(), "");
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  ASSERT_EQ(
      Call(trusted, "/optstep.v1.OptimizerService/ListSessions", v1::ListSessionsRequest(), "")
          .error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  std::map<std::string, double> series;
  for (const auto& [key, value] : testutil::ScrapeMetrics(server->metrics_port())) {
    if (absl::StartsWith(key, "optstep_rpc_errors_total{")) series[key] = value;
  }
  EXPECT_EQ(series.size(), 2u) << "one series per made-up method";
  EXPECT_EQ(series[R"(optstep_rpc_errors_total{code="UNAUTHENTICATED",method="other"})"], kMadeUp);
  const std::string served = "/optstep.v1.OptimizerService/ListSessions";
  EXPECT_EQ(series[absl::StrCat(R"(optstep_rpc_errors_total{code="UNAUTHENTICATED",method=")",
                                served, R"("})")],
            1);
}

TEST_F(SecurityTest, HealthIsOpenAndRolesGrantTheirRpcs) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start(ServerFlags(good_, tokens_file_)));
  // Health needs TLS (the port speaks nothing else) but no token: what a probe can do.
  ClientOptions probe = TlsOptions(good_, server->address(), "");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto anonymous, Client::Connect(probe));
  EXPECT_THAT(testutil::WaitServing(*anonymous), IsOk());
  EXPECT_THAT(anonymous->ListSessions().status(), StatusIs(absl::StatusCode::kUnauthenticated));

  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto user,
                               Client::Connect(TlsOptions(good_, server->address(), kUserToken)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, user->CreateSession(SmallSpec("mine")));
  EXPECT_THAT(StepSmall(*user, info.session_id(), 1).status(), IsOk());
  EXPECT_THAT(user->Save(info.session_id(), "mine").status(),
              StatusIs(absl::StatusCode::kPermissionDenied, "needs an admin token"));
  // An owner closes her own session; an admin closes any.
  EXPECT_THAT(user->CloseSession(info.session_id()), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo theirs, user->CreateSession(SmallSpec("theirs")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto admin,
                               Client::Connect(TlsOptions(good_, server->address(), kAdminToken)));
  EXPECT_THAT(admin->CloseSession(theirs.session_id()), IsOk());
}

// The command line tool's TLS and token flags: exit status and output of `optstep <args>`.
std::pair<int, std::string> Cli(const std::string& env, const std::string& args) {
  const std::string command =
      absl::StrCat(env, " ", testutil::RunfilePath("client/cli/optstep"), " ", args, " 2>&1");
  std::string text;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) text.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

TEST_F(SecurityTest, CommandLineToolPassesTlsAndToken) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start(ServerFlags(good_, tokens_file_)));
  const std::string tls =
      absl::StrCat("--server=", server->address(), " --tls_ca=", good_.ca,
                   " --tls_cert=", good_.client_cert, " --tls_key=", good_.client_key);
  auto health = Cli("", "health " + tls);
  for (int i = 0; i < 50 && health.first != 0; ++i) health = Cli("", "health " + tls);
  EXPECT_EQ(health.first, 0) << health.second;
  EXPECT_THAT(health.second, HasSubstr("SERVING"));

  auto anonymous = Cli("", "session list " + tls);
  EXPECT_NE(anonymous.first, 0);
  EXPECT_THAT(anonymous.second, HasSubstr("UNAUTHENTICATED"));
  auto by_flag = Cli("", absl::StrCat("session list --token=", kUserToken, " ", tls));
  EXPECT_EQ(by_flag.first, 0) << by_flag.second;
  auto by_env = Cli(absl::StrCat("OPTSTEP_TOKEN=", kUserToken), "session list " + tls);
  EXPECT_EQ(by_env.first, 0) << by_env.second;
  auto plaintext = Cli(absl::StrCat("OPTSTEP_TOKEN=", kUserToken),
                       absl::StrCat("session list --server=", server->address()));
  EXPECT_NE(plaintext.first, 0);
  EXPECT_THAT(plaintext.second, HasSubstr("needs tls"));
}

TEST_F(SecurityTest, TokensWithoutTlsAreRefusedAtStart) {
  auto server = ServerProcess::Start({"--auth_tokens_file=" + tokens_file_});
  EXPECT_THAT(server.status(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(SecurityTest, TwoRanksWithTlsAndTokensStep) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto group,
                               testutil::StartGroup(2, ServerFlags(good_, tokens_file_)));
  ClientOptions options = TlsOptions(good_, "", kUserToken);
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  // Rank 0 turns SERVING once rank 1 has joined through the authenticated rendezvous.
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  v1::SessionSpec spec = SmallSpec("pair");
  // Four parameters, so that both ranks own some.
  for (int p = 0; p < 2; ++p) {
    auto* extra = spec.add_parameters();
    extra->set_name(absl::StrCat("fc", p, ".weight"));
    extra->add_shape(8);
    extra->add_shape(4);
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(spec));
  std::vector<float> g32(32, 0.5f), g8(8, -0.25f);
  for (uint64_t step = 1; step <= 2; ++step) {
    StepOptions step_options;
    step_options.session_id = info.session_id();
    step_options.step = step;
    const FullGradient grads[] = {{0, g32}, {1, g8}, {2, g32}, {3, g32}};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(step_options, grads));
    EXPECT_EQ(reply.step, step);
    EXPECT_FALSE(reply.skipped);
    EXPECT_EQ(reply.params.size(), 4u);
  }
}

}  // namespace
}  // namespace optstep
