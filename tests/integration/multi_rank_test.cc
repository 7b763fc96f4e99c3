// Several ranks on loopback (real server processes, Gloo between them) and several trainers
// (threads, each with its own client): the parameters after k steps are bit-identical for every
// world size, in both gradient modes; an incomplete step is aborted on every rank together.

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::StartGroup;
using ::optstep::testutil::StatusIs;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// Parameters of unequal sizes, so that the partition is not trivial.
const std::vector<std::vector<uint64_t>> kShapes = {{24, 16}, {24}, {16, 40}, {16}, {7, 3}, {40, 24}, {5}};

uint64_t Numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// A deterministic gradient value: a function of (step, trainer, param, element).
float GradientValue(int step, int trainer, int param, uint64_t i) {
  const uint64_t h = (uint64_t(step) * 1000003u + uint64_t(trainer) * 7919u + uint64_t(param) * 104729u + i * 2654435761u) % 1000u;
  return (static_cast<float>(h) - 500.0f) / 997.0f;
}

ClientOptions Options(const Group& group) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  return options;
}

absl::Status WaitServing(Client& client) {
  for (int i = 0; i < 200; ++i) {
    auto serving = client.CheckHealth();
    if (serving.ok() && *serving) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("rank 0 never became SERVING");
}

v1::SessionSpec Spec(int trainers, v1::GradientMode mode, const std::string& optimizer) {
  v1::SessionSpec spec;
  for (size_t p = 0; p < kShapes.size(); ++p) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(absl::StrCat("layers.", p, kShapes[p].size() == 1 ? ".bias" : ".weight"));
    for (uint64_t d : kShapes[p]) param->add_shape(d);
  }
  spec.set_num_trainers(trainers);
  spec.set_gradient_mode(mode);
  spec.set_step_deadline_ms(30000);
  spec.mutable_optimizer()->set_preset(optimizer);
  return spec;
}

// Runs `steps` steps with `trainers` concurrent trainers on a group of `world` ranks and answers
// the final parameters (fp32 bits, concatenated).
std::vector<float> Train(int world, int trainers, v1::GradientMode mode,
                         const std::string& optimizer, int steps) {
  auto group = StartGroup(world);
  EXPECT_THAT(group.status(), IsOk());
  if (!group.ok()) return {};
  auto client = Client::Connect(Options(*group));
  EXPECT_THAT(client.status(), IsOk());
  EXPECT_THAT(WaitServing(**client), IsOk());
  auto session = (*client)->CreateSession(Spec(trainers, mode, optimizer));
  EXPECT_THAT(session.status(), IsOk());
  if (!session.ok()) return {};
  EXPECT_EQ(session->layout().world_size(), static_cast<uint32_t>(world));
  EXPECT_EQ(session->layout().rank_targets_size(), world);
  for (uint32_t p = 0; p < kShapes.size(); ++p) {
    std::vector<float> init(Numel(kShapes[p]));
    for (uint64_t i = 0; i < init.size(); ++i) init[i] = 0.01f * static_cast<float>((i * 7 + p) % 13);
    EXPECT_THAT((*client)->InitParameters(session->session_id(), p, init), IsOk());
  }
  for (int step = 1; step <= steps; ++step) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> results(trainers);
    for (int t = 0; t < trainers; ++t) {
      threads.emplace_back([&, t] {
        auto trainer = Client::Connect(Options(*group));
        if (!trainer.ok()) {
          results[t] = trainer.status();
          return;
        }
        std::vector<std::vector<float>> grads(kShapes.size());
        std::vector<GradientSlice> slices;
        for (uint32_t p = 0; p < kShapes.size(); ++p) {
          const uint64_t n = Numel(kShapes[p]);
          // SHARDED: trainer t sends the t-th contiguous slice; REPLICATED: everything.
          uint64_t begin = 0, end = n;
          if (mode == v1::GRADIENT_MODE_SHARDED) {
            begin = n * t / trainers;
            end = n * (t + 1) / trainers;
          }
          if (begin == end) continue;
          for (uint64_t i = begin; i < end; ++i) grads[p].push_back(GradientValue(step, t, p, i));
          GradientSlice slice;
          slice.param_id = p;
          slice.offset = begin;
          slice.bytes = absl::Span<const uint8_t>(
              reinterpret_cast<const uint8_t*>(grads[p].data()), grads[p].size() * sizeof(float));
          slices.push_back(slice);
        }
        StepOptions options;
        options.session_id = session->session_id();
        options.step = step;
        options.trainer_id = t;
        options.skip_return = t != 0;
        results[t] = (*trainer)->Step(options, slices).status();
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < trainers; ++t) EXPECT_THAT(results[t], IsOk()) << "step " << step;
  }
  auto pulled = (*client)->PullParameters(session->session_id(), DType::kF32);
  EXPECT_THAT(pulled.status(), IsOk());
  std::vector<float> all;
  if (!pulled.ok()) return all;
  EXPECT_EQ(pulled->step, static_cast<uint64_t>(steps));
  for (auto& [id, param] : pulled->params) all.insert(all.end(), param.f32.begin(), param.f32.end());
  // Every rank holds the same parameters: compare with rank world-1's.
  if (world > 1) {
    ClientOptions last;
    last.target = (*group)[world - 1]->address();
    auto other = Client::Connect(last);
    EXPECT_THAT(other.status(), IsOk());
    if (other.ok()) {
      auto copy = (*other)->PullParameters(session->session_id(), DType::kF32);
      EXPECT_THAT(copy.status(), IsOk());
      if (copy.ok()) {
        std::vector<float> mine;
        for (auto& [id, param] : copy->params) mine.insert(mine.end(), param.f32.begin(), param.f32.end());
        EXPECT_EQ(0, std::memcmp(mine.data(), all.data(), all.size() * sizeof(float)));
      }
    }
  }
  return all;
}

struct Case {
  v1::GradientMode mode;
  int trainers;
  const char* optimizer;
};

class MultiRankTest : public ::testing::TestWithParam<Case> {};

TEST_P(MultiRankTest, ParametersAreBitIdenticalForEveryWorldSize) {
  const Case c = GetParam();
  const std::vector<float> reference = Train(1, c.trainers, c.mode, c.optimizer, 4);
  ASSERT_FALSE(reference.empty());
  for (int world : {2, 3, 4}) {
    const std::vector<float> got = Train(world, c.trainers, c.mode, c.optimizer, 4);
    ASSERT_EQ(got.size(), reference.size()) << "world " << world;
    EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)))
        << "world " << world << " differs from world 1";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, MultiRankTest,
    ::testing::Values(Case{v1::GRADIENT_MODE_SHARDED, 1, "adam"},
                      Case{v1::GRADIENT_MODE_SHARDED, 3, "adam"},
                      Case{v1::GRADIENT_MODE_REPLICATED, 2, "adam"},
                      Case{v1::GRADIENT_MODE_REPLICATED, 4, "sgd"},
                      Case{v1::GRADIENT_MODE_SHARDED, 2, "muon"},
                      Case{v1::GRADIENT_MODE_REPLICATED, 2, "soap"}));

TEST(MultiRankAbortTest, IncompleteStepIsAbortedOnEveryRankWithStateUnchanged) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, StartGroup(2));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(group)));
  ASSERT_THAT(WaitServing(*client), IsOk());
  v1::SessionSpec spec = Spec(2, v1::GRADIENT_MODE_SHARDED, "adam");
  spec.set_step_deadline_ms(1000);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session, client->CreateSession(spec));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters before, client->PullParameters(session.session_id(), DType::kF32));
  // Only trainer 0 of 2 sends its part: the step never completes.
  std::vector<std::vector<float>> grads;
  std::vector<FullGradient> full;
  for (uint32_t p = 0; p < kShapes.size(); ++p) grads.emplace_back(Numel(kShapes[p]), 0.5f);
  for (uint32_t p = 0; p < kShapes.size(); ++p) full.push_back({p, grads[p]});
  StepOptions options;
  options.session_id = session.session_id();
  options.step = 1;
  EXPECT_THAT(client->Step(options, full).status(), StatusIs(absl::StatusCode::kAborted, "redo the step"));
  // Both ranks are unchanged and still at step 0; the step can be redone by both trainers.
  for (const auto& rank : group) {
    ClientOptions one;
    one.target = rank->address();
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(one));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters after, c->PullParameters(session.session_id(), DType::kF32));
    EXPECT_EQ(after.step, 0u);
    for (auto& [id, param] : after.params) EXPECT_EQ(param.f32, before.params[id].f32);
  }
  std::vector<std::thread> trainers;
  std::vector<absl::Status> results(2);
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      auto trainer = Client::Connect(Options(group));
      std::vector<GradientSlice> slices;
      for (uint32_t p = 0; p < kShapes.size(); ++p) {
        const uint64_t n = grads[p].size(), begin = t == 0 ? 0 : n / 2, end = t == 0 ? n / 2 : n;
        GradientSlice s;
        s.param_id = p;
        s.offset = begin;
        s.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(grads[p].data() + begin),
                                            (end - begin) * sizeof(float));
        if (end > begin) slices.push_back(s);
      }
      StepOptions o = options;
      o.trainer_id = t;
      results[t] = (*trainer)->Step(o, slices).status();
    });
  }
  for (auto& t : trainers) t.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], IsOk());
}

// Trainer 0 commits, then its streams break (client deadline) while trainer 1 is late; it
// reconnects and resends the same step: the step is applied once, with the same result as a run
// without the disconnect.
TEST(MultiRankRetryTest, TrainerThatDisconnectsAfterCommitResendsSafely) {
  std::vector<float> runs[2];
  for (int disconnect = 0; disconnect < 2; ++disconnect) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, StartGroup(2));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(group)));
    ASSERT_THAT(WaitServing(*client), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session,
                                 client->CreateSession(Spec(2, v1::GRADIENT_MODE_REPLICATED, "adam")));
    std::vector<std::vector<float>> grads;
    std::vector<FullGradient> full;
    for (uint32_t p = 0; p < kShapes.size(); ++p) {
      grads.emplace_back(Numel(kShapes[p]));
      for (uint64_t i = 0; i < grads[p].size(); ++i) grads[p][i] = GradientValue(1, 0, p, i);
      full.push_back({p, grads[p]});
    }
    StepOptions options;
    options.session_id = session.session_id();
    options.step = 1;
    if (disconnect) {
      ClientOptions impatient = Options(group);
      impatient.stream_timeout = absl::Milliseconds(300);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(auto first, Client::Connect(impatient));
      EXPECT_THAT(first->Step(options, full).status(),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
    }
    std::thread late([&] {
      auto trainer = Client::Connect(Options(group));
      StepOptions o = options;
      o.trainer_id = 1;
      EXPECT_THAT((*trainer)->Step(o, full).status(), IsOk());
    });
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(options, full));
    late.join();
    EXPECT_EQ(reply.step, 1u);
    for (auto& [id, param] : reply.params) {
      runs[disconnect].insert(runs[disconnect].end(), param.f32.begin(), param.f32.end());
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo after, client->GetSession(session.session_id()));
    EXPECT_EQ(after.step(), 1u);
  }
  ASSERT_FALSE(runs[0].empty());
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace optstep
