// A step sent again through the real server is answered as a replay only for the same
// contribution: when another caller applied step N first, the owner's own step N with her
// gradient is FAILED_PRECONDITION naming the step, not an OK carrying the other's result; the
// same gradient sent again, chunked otherwise, is still a replay (docs/api.md, "Replays").

#include <memory>
#include <string>
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

// fc.weight's 32 and fc.bias's 8 gradient values, from `seed`.
std::vector<std::vector<float>> Gradients(float seed) {
  std::vector<std::vector<float>> grads = {std::vector<float>(32), std::vector<float>(8)};
  for (size_t p = 0; p < grads.size(); ++p) {
    for (size_t i = 0; i < grads[p].size(); ++i) grads[p][i] = seed * (1.0f + i) - 0.5f * p;
  }
  return grads;
}

absl::StatusOr<StepReply> Step(Client& client, const std::string& session_id, uint64_t step,
                               const std::vector<std::vector<float>>& grads) {
  StepOptions options;
  options.session_id = session_id;
  options.step = step;
  const FullGradient full[] = {{0, grads[0]}, {1, grads[1]}};
  return client.Step(options, full);
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const ServerProcess& server,
                                                size_t max_chunk_bytes = 4 << 20) {
  ClientOptions options;
  options.target = server.address();
  options.max_chunk_bytes = max_chunk_bytes;
  return Client::Connect(options);
}

TEST(ReplayTest, AnotherCallersStepIsNotAnsweredAsTheOwnersReplay) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto alice, Connect(*server));
  ASSERT_THAT(testutil::WaitServing(*alice), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, alice->CreateSession(SmallSpec("shared")));
  const std::string& id = info.session_id();
  // Bob gets in first with his gradient for step 1.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto bob, Connect(*server));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply bobs, Step(*bob, id, 1, Gradients(0.25f)));
  ASSERT_EQ(bobs.step, 1u);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters before, alice->PullParameters(id, DType::kF32));
  // Alice's own step 1 is refused, naming the step: her gradient was not applied.
  EXPECT_THAT(Step(*alice, id, 1, Gradients(1.0f)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("step 1 of session '", id,
                                    "' was already applied with a different contribution from "
                                    "trainer 0")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters after, alice->PullParameters(id, DType::kF32));
  for (const auto& [param, values] : before.params) EXPECT_EQ(after.params[param].f32, values.f32);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo now, alice->GetSession(id));
  EXPECT_EQ(now.step(), 1u);
  // Bob's gradient sent again, in 12-byte chunks (words cut by chunk edges), is a replay.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto small_chunks, Connect(*server, 12));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply replayed, Step(*small_chunks, id, 1, Gradients(0.25f)));
  EXPECT_EQ(replayed.step, 1u);
  EXPECT_EQ(replayed.grad_norm, bobs.grad_norm);
  // The session goes on.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply next, Step(*alice, id, 2, Gradients(1.0f)));
  EXPECT_EQ(next.step, 2u);
}

}  // namespace
}  // namespace optstep
