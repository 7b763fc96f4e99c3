// The Step stream end to end on the raw data path: the real client (gradient slices that refer
// to the trainer's memory), the real server (hand-decoded requests, parameters streamed while the
// step fills its snapshot), engine and CPU device, in process on loopback.

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status_payload.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/server.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// Three parameters of 3M elements (12 MiB of fp32 each): the step streams them in buckets.
constexpr int kParams = 3;
constexpr uint64_t kElements = 3 << 20;

class StepStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Create(EngineOptions{});
    ASSERT_THAT(engine.status(), IsOk());
    engine_ = *std::move(engine);
    group_ = std::make_unique<RankGroup>(RankGroupOptions{}, engine_.get());
    ServerOptions options;
    options.host = "127.0.0.1";
    auto server = Server::Start(options, engine_.get(), group_.get());
    ASSERT_THAT(server.status(), IsOk());
    server_ = *std::move(server);
    const std::string target = "127.0.0.1:" + std::to_string(server_->port());
    ASSERT_THAT(group_->Join(target, nullptr), IsOk());
    server_->SetReady(true);
    ClientOptions client_options;
    client_options.target = target;
    for (int t = 0; t < 2; ++t) {
      auto client = Client::Connect(client_options);
      ASSERT_THAT(client.status(), IsOk());
      trainers_.push_back(*std::move(client));
    }
    v1::SessionSpec spec;
    for (int p = 0; p < kParams; ++p) {
      v1::ParameterSpec* param = spec.add_parameters();
      param->set_name("p" + std::to_string(p));
      param->add_shape(kElements);
    }
    spec.set_num_trainers(2);
    spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
    v1::SubOptimizer* sgd = spec.mutable_optimizer()->add_sub_optimizers();
    sgd->set_name("sgd");
    sgd->set_kind("sgd");
    sgd->mutable_sgd()->set_lr(1.0);
    spec.mutable_optimizer()->set_clip_grad(0.0);
    auto session = trainers_[0]->CreateSession(spec);
    ASSERT_THAT(session.status(), IsOk());
    session_ = session->session_id();
    // Small integers: exact in fp32 and bf16 after any number of SGD steps here.
    gradient_.resize(kParams * kElements);
    for (size_t i = 0; i < gradient_.size(); ++i) gradient_[i] = static_cast<float>(i % 7) - 3.0f;
  }

  // Trainer t's half of every parameter.
  std::vector<GradientSlice> Half(int t) const {
    std::vector<GradientSlice> slices;
    for (int p = 0; p < kParams; ++p) {
      const uint64_t begin = kElements * t / 2, end = kElements * (t + 1) / 2;
      GradientSlice slice;
      slice.param_id = p;
      slice.offset = begin;
      slice.bytes = absl::Span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(gradient_.data() + p * kElements + begin),
          (end - begin) * 4);
      slices.push_back(slice);
    }
    return slices;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<Client>> trainers_;
  std::string session_;
  std::vector<float> gradient_;
};

TEST_F(StepStreamTest, TwoTrainersGetEveryParameterStepAfterStep) {
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<absl::StatusOr<StepReply>> replies(2);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        StepOptions options;
        options.session_id = session_;
        options.step = step;
        options.trainer_id = t;
        options.return_dtype = t == 0 ? DType::kF32 : DType::kBF16;
        replies[t] = trainers_[t]->Step(options, Half(t));
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < 2; ++t) {
      ASSERT_THAT(replies[t].status(), IsOk()) << "step " << step << ", trainer " << t;
      EXPECT_EQ(replies[t]->step, step);
      ASSERT_EQ(replies[t]->params.size(), static_cast<size_t>(kParams));
    }
    // SGD with lr 1 from zero: -step * gradient.
    for (int p = 0; p < kParams; ++p) {
      const HostParameter& f32 = replies[0]->params.at(p);
      const HostParameter& bf16 = replies[1]->params.at(p);
      ASSERT_EQ(f32.f32.size(), kElements);
      ASSERT_EQ(bf16.bf16.size(), kElements);
      for (uint64_t i = 0; i < kElements; i += 4099) {
        const float expected = -static_cast<float>(step) * gradient_[p * kElements + i];
        ASSERT_EQ(f32.f32[i], expected) << "param " << p << " element " << i;
        uint32_t bits = uint32_t{bf16.bf16[i]} << 16;
        float widened;
        std::memcpy(&widened, &bits, 4);
        ASSERT_EQ(widened, expected) << "param " << p << " element " << i;
      }
    }
  }
}

TEST_F(StepStreamTest, ARejectedStreamEndsWhileTheTrainerIsStillSending) {
  // 36 MiB of chunks after a header the server refuses: Step answers the server's status and
  // returns only once gRPC has let go of the gradient memory.
  StepOptions options;
  options.session_id = session_;
  options.step = 5;
  std::vector<GradientSlice> all = Half(0);
  for (GradientSlice s : Half(1)) all.push_back(s);
  const absl::Status refused = trainers_[0]->Step(options, all).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition,
                                "step 5 out of sequence; expected step 1"));
  // The step expected crosses gRPC as a payload, for the clients' recovery.
  EXPECT_EQ(PayloadNumber(refused, absl::StatusCode::kFailedPrecondition, kExpectedStepPayload),
            std::optional<uint64_t>(1));
  // The session is unharmed: step 1 still runs.
  options.step = 1;
  options.skip_return = true;
  std::thread other([&] {
    StepOptions o = options;
    o.trainer_id = 1;
    EXPECT_THAT(trainers_[1]->Step(o, Half(1)).status(), IsOk());
  });
  EXPECT_THAT(trainers_[0]->Step(options, Half(0)).status(), IsOk());
  other.join();
}

}  // namespace
}  // namespace optstep
