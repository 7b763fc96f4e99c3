// The server's limits through the real process: each crossing answers RESOURCE_EXHAUSTED with a
// message that names the limit and the value, and the server goes on serving.

#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;

struct Connected {
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<Client> client;
};

absl::StatusOr<Connected> Start(std::vector<std::string> flags, size_t max_chunk_bytes = 4 << 20) {
  Connected c;
  auto server = ServerProcess::Start(std::move(flags));
  if (!server.ok()) return server.status();
  c.server = *std::move(server);
  ClientOptions options;
  options.target = c.server->address();
  options.max_chunk_bytes = max_chunk_bytes;
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  c.client = *std::move(client);
  return c;
}

// The server still creates, steps and closes a session after a refusal.
void ExpectStillServing(Client& client) {
  auto sessions = client.ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  for (const v1::SessionInfo& s : *sessions)
    ASSERT_THAT(client.CloseSession(s.session_id()), IsOk());
  auto info = client.CreateSession(SmallSpec("after"));
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_THAT(StepSmall(client, info->session_id(), 1).status(), IsOk());
  EXPECT_THAT(client.CloseSession(info->session_id()), IsOk());
}

TEST(LimitsTest, MaxSessions) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_sessions=1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo first, c.client->CreateSession(SmallSpec("a")));
  EXPECT_THAT(c.client->CreateSession(SmallSpec("b")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "the server holds 1 sessions; the limit is 1"));
  EXPECT_THAT(StepSmall(*c.client, first.session_id(), 1).status(), IsOk());
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, MaxParamsPerSession) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_params_per_session=2"}));
  v1::SessionSpec three = SmallSpec("three");
  auto* extra = three.add_parameters();
  extra->set_name("fc2.bias");
  extra->add_shape(4);
  EXPECT_THAT(c.client->CreateSession(three).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "session declares 3 parameters; the limit is 2"));
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, MaxSessionBytes) {
  // SmallSpec: 40 fp32 masters and 40 gradients = 320 bytes before optimizer state.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_session_bytes=200"}));
  EXPECT_THAT(c.client->CreateSession(SmallSpec("big")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "the limit is 200 bytes per session"));
  auto sessions = c.client->ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  EXPECT_TRUE(sessions->empty());
}

TEST(LimitsTest, MaxMessageBytes) {
  // 32768 fp32 elements: one 128 KiB chunk with the client's default chunk size.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_message_bytes=65536"}));
  v1::SessionSpec spec;
  spec.set_name("wide");
  auto* w = spec.add_parameters();
  w->set_name("embedding.weight");
  w->add_shape(32768);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("sgd");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  const std::vector<float> values(32768, 0.5f);
  EXPECT_THAT(c.client->InitParameters(info.session_id(), 0, values),
              StatusIs(absl::StatusCode::kResourceExhausted, "vs. 65536"));
  StepOptions step;
  step.session_id = info.session_id();
  step.step = 1;
  const FullGradient grads[] = {{0, values}};
  EXPECT_THAT(c.client->Step(step, grads).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "vs. 65536"));

  // The same step in chunks that fit goes through: nothing was left half-done.
  ClientOptions small;
  small.target = c.server->address();
  small.max_chunk_bytes = 16 << 10;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto fitting, Client::Connect(small));
  EXPECT_THAT(fitting->InitParameters(info.session_id(), 0, values), IsOk());
  step.skip_return = true;  // the answer would again be one large chunk per parameter
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, fitting->Step(step, grads));
  EXPECT_EQ(reply.step, 1u);
}

}  // namespace
}  // namespace optstep
