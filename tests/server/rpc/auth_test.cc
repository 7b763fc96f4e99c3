// The tokens file format, the role each method needs, and the processor's answers.

#include "server/rpc/auth.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

constexpr char kUser[] = "user-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789";

TEST(TokenTableTest, ParsesRolesCommentsAndBlankLines) {
  auto table = TokenTable::Parse(
      absl::StrCat("# trainers\n", kUser, "\n\n  ", kAdmin, "\tadmin  \nother-user-token-42 user\n"),
      "tokens");
  ASSERT_THAT(table.status(), IsOk());
  EXPECT_EQ(table->size(), 3u);
  EXPECT_EQ(table->Find(kUser), Role::kUser);
  EXPECT_EQ(table->Find(kAdmin), Role::kAdmin);
  EXPECT_EQ(table->Find("other-user-token-42"), Role::kUser);
  EXPECT_EQ(table->Find("user-token-012345678"), std::nullopt);   // a prefix
  EXPECT_EQ(table->Find("user-token-01234567890"), std::nullopt);  // longer
  EXPECT_EQ(table->Find(""), std::nullopt);
  EXPECT_EQ(table->FirstAdminToken(), kAdmin);
}

TEST(TokenTableTest, RefusesBadLinesNamingThem) {
  EXPECT_THAT(TokenTable::Parse(absl::StrCat(kUser, "\n", kAdmin, " root\n"), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:2: unknown role 'root'"));
  EXPECT_THAT(TokenTable::Parse("short admin\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:1: token of 5 bytes"));
  EXPECT_THAT(TokenTable::Parse(absl::StrCat(kUser, " user extra\n"), "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f:1: expected 'TOKEN [user|admin]'"));
  EXPECT_THAT(TokenTable::Parse("# nothing\n\n", "f").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "f: no tokens"));
  EXPECT_THAT(TokenTable::Load("/nonexistent/tokens").status(),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent/tokens"));
}

TEST(TokenTableTest, NoAdminTokenIsEmpty) {
  auto table = TokenTable::Parse(kUser, "f");
  ASSERT_THAT(table.status(), IsOk());
  EXPECT_EQ(table->FirstAdminToken(), "");
}

TEST(RequiredRoleTest, HealthOpenAdminCallsAdminRestUser) {
  EXPECT_EQ(RequiredRole("/grpc.health.v1.Health/Check"), std::nullopt);
  EXPECT_EQ(RequiredRole("/grpc.health.v1.Health/Watch"), std::nullopt);
  for (const char* admin :
       {"/optstep.v1.CheckpointService/Save", "/optstep.v1.CheckpointService/Load",
        "/optstep.v1.CheckpointService/ImportStateDict", "/optstep.v1.OptimizerService/CloseSession",
        "/optstep.v1.PeerService/CreateReplica", "/optstep.v1.RendezvousService/Get"}) {
    EXPECT_EQ(RequiredRole(admin), Role::kAdmin) << admin;
  }
  for (const char* user :
       {"/optstep.v1.OptimizerService/CreateSession", "/optstep.v1.OptimizerService/Step",
        "/optstep.v1.OptimizerService/PullParameters",
        "/optstep.v1.CheckpointService/ExportStateDict",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "/unknown/Method", ""}) {
    EXPECT_EQ(RequiredRole(user), Role::kUser) << user;
  }
}

// The processor as gRPC calls it: metadata in, status out, the token consumed on success.
class ProcessorTest : public ::testing::Test {
 protected:
  grpc::Status Process(const std::string& method, const std::string& authorization) {
    std::vector<std::string> storage = {":path", method, "authorization", authorization};
    grpc::AuthMetadataProcessor::InputMetadata input;
    input.insert({storage[0], storage[1]});
    if (!authorization.empty()) input.insert({storage[2], storage[3]});
    consumed_.clear();
    grpc::AuthMetadataProcessor::OutputMetadata response;
    return processor_->Process(input, nullptr, &consumed_, &response);
  }

  std::vector<std::string> refusals_;
  std::shared_ptr<grpc::AuthMetadataProcessor> processor_ = MakeTokenProcessor(
      *TokenTable::Parse(absl::StrCat(kUser, "\n", kAdmin, " admin\n"), "t"),
      [this](absl::string_view method, absl::string_view code) {
        refusals_.push_back(absl::StrCat(method, " ", code));
      });
  grpc::AuthMetadataProcessor::OutputMetadata consumed_;
};

TEST_F(ProcessorTest, Answers) {
  const std::string step = "/optstep.v1.OptimizerService/Step";
  const std::string save = "/optstep.v1.CheckpointService/Save";
  EXPECT_TRUE(Process("/grpc.health.v1.Health/Check", "").ok());
  EXPECT_EQ(Process(step, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Process(step, kUser).error_code(), grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer"
  EXPECT_EQ(Process(step, "Bearer nobody-0123456789").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Process(save, absl::StrCat("Bearer ", kUser)).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(refusals_.size(), 4u);
  EXPECT_EQ(refusals_.back(), save + " PERMISSION_DENIED");

  EXPECT_TRUE(Process(step, absl::StrCat("Bearer ", kUser)).ok());
  EXPECT_EQ(consumed_.count("authorization"), 1u);
  EXPECT_TRUE(Process(save, absl::StrCat("Bearer ", kAdmin)).ok());
  EXPECT_TRUE(Process(step, absl::StrCat("Bearer ", kAdmin)).ok());
  EXPECT_EQ(refusals_.size(), 4u);
}

}  // namespace
}  // namespace optstep
