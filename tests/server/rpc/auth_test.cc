// The tokens file format (named identities: NAME ROLE SECRET), the role each method needs, the
// processor's answers and the identity it hands the services (CallerOf).

#include "server/rpc/auth.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/rpc/caller.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

constexpr char kUser[] = "user-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kPeer[] = "peer-token-0123456789";

// An AuthContext as gRPC hands the processor and the services: properties by name.
class FakeAuthContext final : public grpc::AuthContext {
 public:
  bool IsPeerAuthenticated() const override { return authenticated_; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override { return {}; }
  std::string GetPeerIdentityPropertyName() const override { return ""; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    std::vector<grpc::string_ref> values;
    auto range = properties_.equal_range(name);
    for (auto it = range.first; it != range.second; ++it) values.emplace_back(it->second);
    return values;
  }
  grpc::AuthPropertyIterator begin() const override { return Iterator(); }
  grpc::AuthPropertyIterator end() const override { return Iterator(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    properties_.emplace(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string&) override { return false; }

  void set_authenticated(bool authenticated) { authenticated_ = authenticated; }
  size_t size() const { return properties_.size(); }

 private:
  struct Iterator : grpc::AuthPropertyIterator {};
  std::multimap<std::string, std::string> properties_;
  bool authenticated_ = false;
};

std::string Table() {
  return absl::StrCat("# name role secret\nalice user ", kUser, "\n\n  root\tadmin  ", kAdmin,
                      "\nranks peer ", kPeer, "\nbob user other-user-token-42\n");
}

TEST(TokenTableTest, ParsesNamedIdentitiesCommentsAndBlankLines) {
  auto table = TokenTable::Parse(Table(), "tokens");
  ASSERT_THAT(table.status(), IsOk());
  EXPECT_EQ(table->size(), 4u);
  auto Is = [&](const char* secret, const char* name, Role role) {
    const std::optional<Identity> found = table->Find(secret);
    ASSERT_TRUE(found.has_value()) << secret;
    EXPECT_EQ(found->name, name);
    EXPECT_EQ(found->role, role);
  };
  Is(kUser, "alice", Role::kUser);
  Is(kAdmin, "root", Role::kAdmin);
  Is(kPeer, "ranks", Role::kPeer);
  Is("other-user-token-42", "bob", Role::kUser);
  EXPECT_EQ(table->Find("user-token-012345678"), std::nullopt);    // a prefix
  EXPECT_EQ(table->Find("user-token-01234567890"), std::nullopt);  // longer
  EXPECT_EQ(table->Find("alice"), std::nullopt);                   // a name is no secret
  EXPECT_EQ(table->Find(""), std::nullopt);
  EXPECT_EQ(table->FirstPeerSecret(), kPeer);
}

TEST(TokenTableTest, RefusesBadLinesNamingThem) {
  EXPECT_THAT(TokenTable::Parse(absl::StrCat("a user ", kUser, "\nb root ", kAdmin), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:2: unknown role 'root'"));
  EXPECT_THAT(TokenTable::Parse("a admin short\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:1: secret of 5 bytes"));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat("a user ", kUser, " extra\n"), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:1: expected 'NAME ROLE SECRET'"));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat("a user ", kUser, "\na admin ", kAdmin), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:2: name 'a' is given twice"));
  EXPECT_THAT(
      TokenTable::Parse(absl::StrCat("a user ", kUser, "\nb admin ", kUser), "f").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "f:2: the secret of 'b' is given twice"));
  EXPECT_THAT(TokenTable::Parse("# nothing\n\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f: no tokens"));
  EXPECT_THAT(TokenTable::Load("/nonexistent/tokens").status(),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/tokens"));
}

TEST(TokenTableTest, FormerSecretRoleLinesAreRefusedWithTheNewFormat) {
  EXPECT_THAT(TokenTable::Parse(absl::StrCat(kUser, "\n"), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "f:1: expected 'NAME ROLE SECRET' (ROLE: user, admin or peer), got 1 field; "
                       "lines of the former 'SECRET [ROLE]' format need a name"));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat(kAdmin, " admin\n"), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "former 'SECRET [ROLE]' format"));
}

TEST(TokenTableTest, NoPeerEntryIsEmpty) {
  auto table = TokenTable::Parse(absl::StrCat("root admin ", kAdmin), "f");
  ASSERT_THAT(table.status(), IsOk());
  EXPECT_EQ(table->FirstPeerSecret(), "");
}

TEST(RequiredRoleTest, HealthOpenAdminCallsAdminPeerCallsPeerRestUser) {
  EXPECT_EQ(RequiredRole("/grpc.health.v1.Health/Check"), std::nullopt);
  EXPECT_EQ(RequiredRole("/grpc.health.v1.Health/Watch"), std::nullopt);
  for (const char* admin :
       {"/optstep.v1.CheckpointService/Save", "/optstep.v1.CheckpointService/Load",
        "/optstep.v1.CheckpointService/ImportStateDict", "/optstep.v1.AdminService/Shutdown"}) {
    EXPECT_EQ(RequiredRole(admin), Role::kAdmin) << admin;
  }
  for (const char* peer :
       {"/optstep.v1.PeerService/CreateReplica", "/optstep.v1.PeerService/CloseReplica",
        "/optstep.v1.RendezvousService/Get"}) {
    EXPECT_EQ(RequiredRole(peer), Role::kPeer) << peer;
  }
  for (const char* user :
       {"/optstep.v1.OptimizerService/CreateSession", "/optstep.v1.OptimizerService/Step",
        // The owner closes her own session; the service checks the owner.
        "/optstep.v1.OptimizerService/CloseSession", "/optstep.v1.OptimizerService/PullParameters",
        "/optstep.v1.CheckpointService/ExportStateDict",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "/unknown/Method", ""}) {
    EXPECT_EQ(RequiredRole(user), Role::kUser) << user;
  }
}

// The processor as gRPC calls it: metadata in, status out, the token consumed and the identity
// recorded on success.
class ProcessorTest : public ::testing::Test {
 protected:
  grpc::Status Process(const std::string& method, const std::string& authorization) {
    std::vector<std::string> storage = {":path", method, "authorization", authorization};
    grpc::AuthMetadataProcessor::InputMetadata input;
    input.insert({storage[0], storage[1]});
    if (!authorization.empty()) input.insert({storage[2], storage[3]});
    consumed_.clear();
    context_ = FakeAuthContext();
    grpc::AuthMetadataProcessor::OutputMetadata response;
    return processor_->Process(input, &context_, &consumed_, &response);
  }
  grpc::Status ProcessBearer(const std::string& method, const std::string& secret) {
    return Process(method, absl::StrCat("Bearer ", secret));
  }

  std::vector<std::string> refusals_;
  std::shared_ptr<grpc::AuthMetadataProcessor> processor_ = MakeTokenProcessor(
      *TokenTable::Parse(Table(), "t"), [this](absl::string_view method, absl::string_view code) {
        refusals_.push_back(absl::StrCat(method, " ", code));
      });
  grpc::AuthMetadataProcessor::OutputMetadata consumed_;
  FakeAuthContext context_;
};

TEST_F(ProcessorTest, Answers) {
  const std::string step = "/optstep.v1.OptimizerService/Step";
  const std::string save = "/optstep.v1.CheckpointService/Save";
  EXPECT_TRUE(Process("/grpc.health.v1.Health/Check", "").ok());
  EXPECT_EQ(Process(step, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Process(step, kUser).error_code(), grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer"
  EXPECT_EQ(ProcessBearer(step, "nobody-0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ProcessBearer(save, kUser).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refusals_.size(), 4u);
  EXPECT_EQ(refusals_.back(), save + " PERMISSION_DENIED");
  EXPECT_EQ(context_.size(), 0u) << "a refused call carries no identity";

  EXPECT_TRUE(ProcessBearer(step, kUser).ok());
  EXPECT_EQ(consumed_.count("authorization"), 1u);
  EXPECT_TRUE(ProcessBearer(save, kAdmin).ok());
  EXPECT_TRUE(ProcessBearer(step, kAdmin).ok());
  EXPECT_EQ(refusals_.size(), 4u);
}

TEST_F(ProcessorTest, PeerSecretsServeOnlyTheRanksOwnServicesAndOnlyThey) {
  const std::string close_replica = "/optstep.v1.PeerService/CloseReplica";
  const grpc::Status admin = ProcessBearer(close_replica, kAdmin);
  EXPECT_EQ(admin.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin.error_message(),
            close_replica + " needs a peer token; this token has the admin role");
  EXPECT_EQ(ProcessBearer(close_replica, kUser).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(ProcessBearer(close_replica, kPeer).ok());
  EXPECT_TRUE(ProcessBearer("/optstep.v1.RendezvousService/Get", kPeer).ok());
  for (const char* method :
       {"/optstep.v1.OptimizerService/ListSessions", "/optstep.v1.CheckpointService/Save"}) {
    EXPECT_EQ(ProcessBearer(method, kPeer).error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << method;
  }
}

TEST_F(ProcessorTest, AnAcceptedCallCarriesItsIdentityToTheServices) {
  ASSERT_TRUE(ProcessBearer("/optstep.v1.OptimizerService/Step", kUser).ok());
  Caller caller = CallerOf(&context_);
  EXPECT_EQ(caller.identity, "alice");
  EXPECT_FALSE(caller.sees_all);
  ASSERT_TRUE(ProcessBearer("/optstep.v1.OptimizerService/ListSessions", kAdmin).ok());
  caller = CallerOf(&context_);
  EXPECT_EQ(caller.identity, "root");
  EXPECT_TRUE(caller.sees_all);
}

TEST(SubjectRolesTest, PeersAdminsAndEveryoneElseAUser) {
  auto roles = SubjectRoles::Make({"rank", "rank-b"}, {"ops"});
  ASSERT_THAT(roles.status(), IsOk());
  EXPECT_EQ(roles->RoleOf("rank"), Role::kPeer);
  EXPECT_EQ(roles->RoleOf("rank-b"), Role::kPeer);
  EXPECT_EQ(roles->RoleOf("ops"), Role::kAdmin);
  EXPECT_EQ(roles->RoleOf("trainer-7"), Role::kUser);
  EXPECT_EQ(roles->RoleOf("Rank"), Role::kUser);  // exact names only
  EXPECT_EQ(roles->RoleOf(""), Role::kUser);
  EXPECT_THAT(
      SubjectRoles::Make({"rank"}, {"ops", "rank"}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "subject 'rank' is both a peer and an admin"));
  EXPECT_THAT(SubjectRoles::Make({""}, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty"));
}

TEST(SubjectRolesTest, SplitsCommaSeparatedNames) {
  EXPECT_EQ(SplitSubjects("a, b ,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(SplitSubjects(" ops team ,,"), (std::vector<std::string>{"ops team"}));
  EXPECT_TRUE(SplitSubjects("").empty());
  EXPECT_TRUE(SplitSubjects(" , ").empty());
}

// The subject processor as gRPC calls it under mutual TLS: the verified certificate's common name
// on the AuthContext, no authorization metadata.
class SubjectProcessorTest : public ::testing::Test {
 protected:
  grpc::Status Process(const std::string& method, const std::string& common_name,
                       bool authenticated = true) {
    std::vector<std::string> storage = {":path", method};
    grpc::AuthMetadataProcessor::InputMetadata input;
    input.insert({storage[0], storage[1]});
    context_ = FakeAuthContext();
    context_.set_authenticated(authenticated);
    if (!common_name.empty()) context_.AddProperty("x509_common_name", common_name);
    grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
    return processor_->Process(input, &context_, &consumed, &response);
  }

  std::vector<std::string> refusals_;
  std::shared_ptr<grpc::AuthMetadataProcessor> processor_ =
      MakeSubjectProcessor(*SubjectRoles::Make({"rank"}, {"ops"}),
                           [this](absl::string_view method, absl::string_view code) {
                             refusals_.push_back(absl::StrCat(method, " ", code));
                           });
  FakeAuthContext context_;
};

TEST_F(SubjectProcessorTest, TheCommonNameGivesTheRole) {
  const std::string step = "/optstep.v1.OptimizerService/Step";
  const std::string close = "/optstep.v1.OptimizerService/CloseSession";
  const std::string save = "/optstep.v1.CheckpointService/Save";
  const std::string close_replica = "/optstep.v1.PeerService/CloseReplica";
  const std::string rendezvous = "/optstep.v1.RendezvousService/Set";
  EXPECT_TRUE(Process("/grpc.health.v1.Health/Check", "").ok());
  // Any other verified certificate is a user.
  EXPECT_TRUE(Process(step, "trainer-7").ok());
  EXPECT_TRUE(Process(close, "trainer-7").ok());
  const grpc::Status save_as_user = Process(save, "trainer-7");
  EXPECT_EQ(save_as_user.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(save_as_user.error_message(),
            save + " needs an admin certificate; the certificate of 'trainer-7' has the user role");
  const grpc::Status peer_as_user = Process(close_replica, "trainer-7");
  EXPECT_EQ(peer_as_user.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(peer_as_user.error_message(),
            close_replica +
                " needs a peer certificate; the certificate of 'trainer-7' has the user role");
  EXPECT_TRUE(context_.FindPropertyValues(kIdentityProperty).empty())
      << "a refused call carries no identity";
  EXPECT_TRUE(context_.FindPropertyValues(kRoleProperty).empty());
  // An admin certificate: admin and user calls, not the ranks' own.
  EXPECT_TRUE(Process(save, "ops").ok());
  EXPECT_TRUE(Process(step, "ops").ok());
  EXPECT_EQ(Process(close_replica, "ops").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Process(rendezvous, "ops").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A peer certificate: the ranks' own services only.
  EXPECT_TRUE(Process(close_replica, "rank").ok());
  EXPECT_TRUE(Process(rendezvous, "rank").ok());
  EXPECT_EQ(Process(step, "rank").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Process(save, "rank").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refusals_.size(), 6u);
  EXPECT_EQ(refusals_.front(), save + " PERMISSION_DENIED");
}

TEST_F(SubjectProcessorTest, ACertificateWithoutCommonNameIsUnauthenticated) {
  const std::string list = "/optstep.v1.OptimizerService/ListSessions";
  const grpc::Status nameless = Process(list, "");
  EXPECT_EQ(nameless.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(nameless.error_message(), ::testing::HasSubstr("no common name"));
  EXPECT_EQ(Process(list, "trainer-7", /*authenticated=*/false).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(refusals_,
            (std::vector<std::string>{list + " UNAUTHENTICATED", list + " UNAUTHENTICATED"}));
}

TEST_F(SubjectProcessorTest, TheCertificateNamesTheCallerAndAdminsSeeAll) {
  ASSERT_TRUE(Process("/optstep.v1.OptimizerService/ListSessions", "trainer-7").ok());
  Caller caller = CallerOf(&context_);
  EXPECT_EQ(caller.identity, "trainer-7");
  EXPECT_FALSE(caller.sees_all);
  ASSERT_TRUE(Process("/optstep.v1.OptimizerService/ListSessions", "ops").ok());
  caller = CallerOf(&context_);
  EXPECT_EQ(caller.identity, "ops");
  EXPECT_TRUE(caller.sees_all);
}

TEST(CallerTest, WithoutAuthenticationEveryoneIsAnonymousAndSeesAll) {
  FakeAuthContext plain;
  for (const Caller& caller : {CallerOf(&plain), CallerOf(nullptr)}) {
    EXPECT_EQ(caller.identity, Caller::kAnonymous);
    EXPECT_TRUE(caller.sees_all);
  }
}

// A bound per caller counts an authenticated caller by its identity on each host (a job's
// trainers share one identity on many hosts), and anonymous callers (one identity for all) by
// their host.
TEST(CallerTest, TheKeyOfABoundIsTheIdentityOnAHostOrTheAnonymousCallersHost) {
  EXPECT_EQ(CallerKey(Caller{"alice", false}, "ipv4:10.0.0.7:51234"),
            "caller 'alice' at ipv4:10.0.0.7");
  EXPECT_EQ(CallerKey(Caller{"alice", false}, "ipv4:10.0.0.7:7"),
            "caller 'alice' at ipv4:10.0.0.7");
  EXPECT_EQ(CallerKey(Caller{"alice", false}, "ipv4:10.0.0.8:7"),
            "caller 'alice' at ipv4:10.0.0.8");
  EXPECT_EQ(CallerKey(Caller{Caller::kAnonymous, true}, "ipv4:10.0.0.7:51234"),
            "peer ipv4:10.0.0.7");
  EXPECT_EQ(CallerKey(Caller{"line\nbreak", false}, "unix:"), "caller 'line\\nbreak' at unix:");
}

}  // namespace
}  // namespace optstep
