// Client::OpenStep through the real server: gradients added piece by piece (from two threads, in
// small chunks) give the same step as Client::Step with all of them at once, bit for bit; bad
// slices are refused without harming the stream; a stream dropped before Finish applies nothing.
// Client::Step with destinations writes the returned parameters into them, and refuses a
// destination of the wrong size before any gradient is sent.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "client/cpp/client.h"
#include "client/cpp/step_recovery.h"
#include "client/cpp/step_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::Pulled;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;

// fc.weight's 32 and fc.bias's 8 gradient values of `step`.
std::vector<std::vector<float>> Gradients(uint64_t step) {
  std::vector<std::vector<float>> grads = {std::vector<float>(32), std::vector<float>(8)};
  for (size_t p = 0; p < grads.size(); ++p) {
    for (size_t i = 0; i < grads[p].size(); ++i) grads[p][i] = 0.01f * step * (1.0f + i) - p;
  }
  return grads;
}

GradientSlice Slice(uint32_t param_id, absl::Span<const float> values, uint64_t offset) {
  GradientSlice slice;
  slice.param_id = param_id;
  slice.offset = offset;
  slice.bytes = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                                    values.size() * sizeof(float));
  return slice;
}

StepOptions Options(const std::string& session_id, uint64_t step) {
  StepOptions options;
  options.session_id = session_id;
  options.step = step;
  return options;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const ServerProcess& server,
                                                size_t max_chunk_bytes) {
  ClientOptions options;
  options.target = server.address();
  options.max_chunk_bytes = max_chunk_bytes;
  return Client::Connect(options);
}

TEST(StreamedStepTest, PiecesFromTwoThreadsMatchOneStep) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, 12));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo whole, client->CreateSession(SmallSpec("whole")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo streamed,
                               client->CreateSession(SmallSpec("streamed")));
  for (uint64_t step = 1; step <= 3; ++step) {
    const std::vector<std::vector<float>> grads = Gradients(step);
    const FullGradient full[] = {{0, grads[0]}, {1, grads[1]}};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply expected,
                                 client->Step(Options(whole.session_id(), step), full));

    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream,
                                 client->OpenStep(Options(streamed.session_id(), step)));
    const absl::Span<const float> weight(grads[0]);
    std::thread other([&] {
      const GradientSlice late[] = {Slice(0, weight.subspan(20), 20), Slice(1, grads[1], 0)};
      EXPECT_THAT(stream->Add(late), IsOk());
    });
    const GradientSlice early[] = {Slice(0, weight.subspan(0, 20), 0)};
    EXPECT_THAT(stream->Add(early), IsOk());
    other.join();
    // fc.weight goes straight into a buffer of ours; both parameters are announced whole.
    std::vector<float> weight_out(32);
    ASSERT_THAT(stream->WriteInto(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(weight_out.data()),
                                                    weight_out.size() * sizeof(float))),
                IsOk());
    std::vector<uint32_t> ready;
    stream->OnParamReady([&](uint32_t id) { ready.push_back(id); });
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, stream->Finish());
    EXPECT_EQ(reply.step, step);
    EXPECT_EQ(reply.grad_norm, expected.grad_norm);
    EXPECT_THAT(ready, ::testing::UnorderedElementsAre(0u, 1u));
    EXPECT_EQ(reply.destinations_filled, 1u);
    ASSERT_EQ(reply.params.size(), 1u);
    EXPECT_EQ(weight_out, expected.params[0].f32);
    EXPECT_EQ(reply.params[1].f32, expected.params[1].f32);
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string a, Pulled(*client, whole.session_id()));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string b, Pulled(*client, streamed.session_id()));
  EXPECT_EQ(a, b);
}

// Steps applied through streams are steps this client saw: when the session then comes back at
// an older step (its state imported by another client, as a restore from a checkpoint does), the
// next step is a rewind to that step, not the caller's mistake (FAILED_PRECONDITION, out of
// sequence). The client that imported it knows the session's step: to it, a step out of
// sequence is the caller's mistake.
TEST(StreamedStepTest, AStepAfterARollbackOfStreamedStepsIsARewind) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, 4 << 20));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("rolled")));
  std::vector<Client::StateDictEntry> at_two;
  for (uint64_t step = 1; step <= 4; ++step) {
    const std::vector<std::vector<float>> grads = Gradients(step);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream,
                                 client->OpenStep(Options(info.session_id(), step)));
    const GradientSlice all[] = {Slice(0, grads[0], 0), Slice(1, grads[1], 0)};
    ASSERT_THAT(stream->Add(all), IsOk());
    ASSERT_THAT(stream->Finish().status(), IsOk());
    if (step == 2) {
      v1::ExportStateDictRequest request;
      request.set_session_id(info.session_id());
      OPTSTEP_ASSERT_OK_AND_ASSIGN(at_two, client->ExportStateDict(request));
    }
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto importer, Connect(*server, 4 << 20));
  ASSERT_THAT(importer->ImportStateDict(info.session_id(), at_two), IsOk());
  const std::vector<std::vector<float>> grads = Gradients(5);
  const FullGradient full[] = {{0, grads[0]}, {1, grads[1]}};
  const absl::Status rewound = client->Step(Options(info.session_id(), 5), full).status();
  EXPECT_THAT(rewound, StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(RewindStep(rewound), std::optional<uint64_t>(2)) << rewound;
  ASSERT_THAT(importer->ImportStateDict(info.session_id(), at_two), IsOk());
  const absl::Status refused = importer->Step(Options(info.session_id(), 5), full).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition, "expected step 3"));
  EXPECT_EQ(RewindStep(refused), std::nullopt) << refused;
}

TEST(StreamedStepTest, BadSlicesAreRefusedAndTheStreamGoesOn) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, 4 << 20));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("bad")));
  const std::vector<std::vector<float>> grads = Gradients(1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream,
                               client->OpenStep(Options(info.session_id(), 1)));
  const GradientSlice unknown[] = {Slice(7, grads[1], 0)};
  EXPECT_THAT(stream->Add(unknown), StatusIs(absl::StatusCode::kNotFound));
  const GradientSlice past_end[] = {Slice(1, grads[1], 4)};
  EXPECT_THAT(stream->Add(past_end), StatusIs(absl::StatusCode::kInvalidArgument));
  const GradientSlice all[] = {Slice(0, grads[0], 0), Slice(1, grads[1], 0)};
  ASSERT_THAT(stream->Add(all), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, stream->Finish());
  EXPECT_EQ(reply.step, 1u);
  EXPECT_THAT(stream->Add(all), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(stream->Finish().status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A step with a bad number is refused before any stream opens.
  EXPECT_THAT(client->OpenStep(Options(info.session_id(), 0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StreamedStepTest, AStreamDroppedBeforeFinishAppliesNothing) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, 4 << 20));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("dropped")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string before, Pulled(*client, info.session_id()));
  const std::vector<std::vector<float>> grads = Gradients(1);
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream,
                                 client->OpenStep(Options(info.session_id(), 1)));
    const GradientSlice all[] = {Slice(0, grads[0], 0), Slice(1, grads[1], 0)};
    ASSERT_THAT(stream->Add(all), IsOk());
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo now, client->GetSession(info.session_id()));
  EXPECT_EQ(now.step(), 0u);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string after, Pulled(*client, info.session_id()));
  EXPECT_EQ(before, after);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, testutil::StepSmall(*client, info.session_id(), 1));
  EXPECT_EQ(reply.step, 1u);
}

TEST(StreamedStepTest, StepWritesReturnedParametersIntoTheirDestinations) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(*server, 12));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo plain, client->CreateSession(SmallSpec("plain")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo into, client->CreateSession(SmallSpec("into")));
  std::vector<float> weight_out(32);
  auto bytes_of = [](std::vector<float>& values) {
    return absl::MakeSpan(reinterpret_cast<uint8_t*>(values.data()), values.size() * 4);
  };
  for (uint64_t step = 1; step <= 2; ++step) {
    const std::vector<std::vector<float>> grads = Gradients(step);
    const FullGradient full[] = {{0, grads[0]}, {1, grads[1]}};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply expected,
                                 client->Step(Options(plain.session_id(), step), full));
    EXPECT_EQ(expected.destinations_filled, 0u);
    const GradientSlice all[] = {Slice(0, grads[0], 0), Slice(1, grads[1], 0)};

    // A destination one element short is refused, and the step is not applied.
    std::vector<float> short_out(31);
    EXPECT_THAT(client->Step(Options(into.session_id(), step), all, {{0, bytes_of(short_out)}}),
                StatusIs(absl::StatusCode::kInvalidArgument, "has 124 bytes, expected 128"));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo now, client->GetSession(into.session_id()));
    EXPECT_EQ(now.step(), step - 1);

    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(Options(into.session_id(), step),
                                                               all, {{0, bytes_of(weight_out)}}));
    EXPECT_EQ(reply.step, step);
    EXPECT_EQ(reply.destinations_filled, 1u);
    ASSERT_EQ(reply.params.size(), 1u);
    EXPECT_EQ(reply.params.count(0), 0u);
    EXPECT_EQ(weight_out, expected.params[0].f32);
    EXPECT_EQ(reply.params[1].f32, expected.params[1].f32);
  }
}

}  // namespace
}  // namespace optstep
