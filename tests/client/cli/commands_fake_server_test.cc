// The `optstep` commands against a fake rank: exit statuses and output.

#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/health_check_service_interface.h>

#include "client/cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_optimizer_service.h"
#include "tests/testing/session_info_helpers.h"

namespace optstep {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

class CommandsFakeServerTest : public ::testing::Test {
 protected:
  CommandsFakeServerTest()
      : service_(testutil::MakeSessionInfo("sess-1", 1, {{"w", {2, 3}, 0}, {"b", {4}, 0}})),
        fake_(testutil::StartFakeServer(&service_)) {}

  int Run(std::vector<std::string> args) {
    ClientOptions options;
    options.target = fake_.target;
    options.connect_timeout = absl::Seconds(5);
    options.rpc_timeout = absl::Seconds(5);
    out_.str("");
    err_.str("");
    return RunCommand(args, options, out_, err_);
  }

  testutil::FakeOptimizerService service_;
  testutil::FakeServer fake_;
  std::ostringstream out_, err_;
};

TEST_F(CommandsFakeServerTest, HealthExitStatusFollowsServingStatus) {
  EXPECT_EQ(Run({"health"}), kExitOk);
  EXPECT_EQ(out_.str(), "SERVING\n");
  EXPECT_THAT(err_.str(), IsEmpty());
  fake_.server->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_EQ(Run({"health"}), kExitNotServing);
  EXPECT_EQ(out_.str(), "NOT_SERVING\n");
}

TEST_F(CommandsFakeServerTest, SessionListAndShow) {
  EXPECT_EQ(Run({"session", "list"}), kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("ID      NAME         PARAMS"));
  EXPECT_THAT(out_.str(), HasSubstr("sess-1  test-sess-1       2"));

  EXPECT_EQ(Run({"session", "show", "sess-1"}), kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("session        sess-1\n"));
  EXPECT_THAT(out_.str(), HasSubstr("parameters (2)"));

  EXPECT_EQ(Run({"session", "show", "nope"}), kExitCallFailed);
  EXPECT_THAT(out_.str(), IsEmpty());
  EXPECT_EQ(err_.str(), "optstep session show: " + fake_.target +
                            ": NOT_FOUND: session 'nope' not found\n");
}

}  // namespace
}  // namespace cli
}  // namespace optstep
