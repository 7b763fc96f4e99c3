#include "client/cli/commands.h"

#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Outcome {
  int exit_status;
  std::string out;
  std::string err;
};

Outcome RunTool(std::vector<std::string> args, const std::string& target = "localhost:1") {
  ClientOptions options;
  options.target = target;
  options.connect_timeout = absl::Milliseconds(200);
  options.rpc_timeout = absl::Milliseconds(200);
  std::ostringstream out, err;
  const int status = RunCommand(args, options, out, err);
  return {status, out.str(), err.str()};
}

TEST(CommandsTest, UsageErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{{},
                                                                {"bogus"},
                                                                {"health", "a", "b"},
                                                                {"shutdown", "x"},
                                                                {"session"},
                                                                {"session", "drop"},
                                                                {"session", "list", "x"},
                                                                {"session", "show"},
                                                                {"session", "show", "a", "b"}}) {
    const Outcome o = RunTool(args);
    EXPECT_EQ(o.exit_status, kExitUsage) << ::testing::PrintToString(args);
    EXPECT_THAT(o.err, HasSubstr("usage: optstep <command>"));
    EXPECT_THAT(o.out, IsEmpty());
  }
  EXPECT_THAT(RunTool({"bogus"}).err, HasSubstr("unknown command 'bogus'"));
  EXPECT_THAT(RunTool({"session", "show"}).err, HasSubstr("session show takes one session id"));
}

TEST(CommandsTest, UnreachableServerIsAClearFailure) {
  // Port 1 on loopback: nothing listens there.
  const Outcome health = RunTool({"health"});
  EXPECT_EQ(health.exit_status, kExitCallFailed);
  EXPECT_THAT(health.err, HasSubstr("optstep health: localhost:1: UNAVAILABLE"));
  EXPECT_THAT(health.out, IsEmpty());

  const Outcome list = RunTool({"session", "list"});
  EXPECT_EQ(list.exit_status, kExitCallFailed);
  EXPECT_THAT(list.err, HasSubstr("optstep session list: localhost:1: UNAVAILABLE"));
}

TEST(CommandsTest, InvalidTargetIsReported) {
  const Outcome o = RunTool({"health"}, "");
  EXPECT_EQ(o.exit_status, kExitCallFailed);
  EXPECT_THAT(o.err, HasSubstr("INVALID_ARGUMENT"));
}

}  // namespace
}  // namespace cli
}  // namespace optstep
