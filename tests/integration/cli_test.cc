// The `optstep` command line tool against the real server binary.

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::RunfilePath;
using ::optstep::testutil::ServerProcess;
using ::testing::HasSubstr;

struct Output {
  int exit_code = -1;
  std::string text;
};

Output RunCli(const std::string& args) {
  const std::string command = RunfilePath("client/cli/optstep") + " " + args + " 2>&1";
  Output out;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.text.append(buffer, n);
  const int status = pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(CliTest, HealthSessionListAndShow) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  const std::string flag = "--server=" + server->address();

  // SERVING once the rank has joined its group (at once for one rank).
  Output health = RunCli("health " + flag);
  for (int i = 0; i < 50 && health.exit_code != 0; ++i) health = RunCli("health " + flag);
  EXPECT_EQ(health.exit_code, 0) << health.text;
  EXPECT_THAT(health.text, HasSubstr("SERVING"));
  // One service: the process's own liveness (what the tls overlay's liveness probe asks), and a
  // service the server does not know (NOT_FOUND: the call failed).
  Output liveness = RunCli("health optstep.liveness " + flag);
  EXPECT_EQ(liveness.exit_code, 0) << liveness.text;
  EXPECT_THAT(liveness.text, HasSubstr("SERVING"));
  Output unknown = RunCli("health no.such.service " + flag);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.text;
  EXPECT_THAT(unknown.text, HasSubstr("NOT_FOUND"));

  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  v1::SessionSpec spec;
  spec.set_name("cli-demo");
  auto* w = spec.add_parameters();
  w->set_name("layers.0.fc1.weight");
  w->add_shape(16);
  w->add_shape(8);
  auto* b = spec.add_parameters();
  b->set_name("layers.0.fc1.bias");
  b->add_shape(16);
  spec.set_num_trainers(2);
  spec.set_gradient_mode(v1::GRADIENT_MODE_REPLICATED);
  spec.mutable_optimizer()->set_preset("adam");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(spec));

  Output list = RunCli("session list " + flag);
  EXPECT_EQ(list.exit_code, 0) << list.text;
  EXPECT_THAT(list.text, HasSubstr(info.session_id()));
  EXPECT_THAT(list.text, HasSubstr("cli-demo"));

  Output show = RunCli("session show " + info.session_id() + " " + flag);
  EXPECT_EQ(show.exit_code, 0) << show.text;
  EXPECT_THAT(show.text, HasSubstr("layers.0.fc1.weight"));
  EXPECT_THAT(show.text, HasSubstr("[16, 8]"));
  EXPECT_THAT(show.text, HasSubstr("adam"));

  Output missing = RunCli("session show nope " + flag);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.text, HasSubstr("NOT_FOUND"));

  Output shutdown = RunCli("shutdown " + flag);
  EXPECT_EQ(shutdown.exit_code, 0) << shutdown.text;
  EXPECT_THAT(shutdown.text, HasSubstr("shutting down " + server->address()));
  const int status = server->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  Output down = RunCli("health --timeout_ms=500 " + flag);
  EXPECT_NE(down.exit_code, 0);
}

TEST(CliTest, SaveAndLoadACheckpoint) {
  char pattern[] = "/tmp/optstep-cli-ckpt-XXXXXX";
  const std::string root = mkdtemp(pattern);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start({"--checkpoint_root=" + root}));
  const std::string flag = "--server=" + server->address();
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  v1::SessionSpec spec;
  auto* w = spec.add_parameters();
  w->set_name("w");
  w->add_shape(4);
  w->add_shape(3);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("adam");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(spec));
  const std::string session = "--session=" + info.session_id();

  // Not a terminal: plain progress lines, then the result.
  Output saved = RunCli("save " + session + " --name=first " + flag);
  EXPECT_EQ(saved.exit_code, 0) << saved.text;
  EXPECT_THAT(saved.text, HasSubstr("save: "));
  EXPECT_THAT(saved.text,
              HasSubstr("saved checkpoint 'first' of session " + info.session_id() + " at step 0"));
  Output again = RunCli("save " + session + " --name=first " + flag);
  EXPECT_EQ(again.exit_code, 2) << again.text;
  EXPECT_THAT(again.text, HasSubstr("ALREADY_EXISTS"));
  Output loaded = RunCli("load " + session + " --name=first " + flag);
  EXPECT_EQ(loaded.exit_code, 0) << loaded.text;
  EXPECT_THAT(loaded.text, HasSubstr("loaded checkpoint 'first'"));
  Output escape = RunCli("load " + session + " --name=../x " + flag);
  EXPECT_EQ(escape.exit_code, 2) << escape.text;
  EXPECT_THAT(escape.text, HasSubstr("INVALID_ARGUMENT"));
  Output usage = RunCli("save --name=first " + flag);
  EXPECT_EQ(usage.exit_code, 64) << usage.text;
  EXPECT_THAT(usage.text, HasSubstr("--session"));
  std::system(("rm -rf '" + root + "'").c_str());
}

}  // namespace
}  // namespace optstep
