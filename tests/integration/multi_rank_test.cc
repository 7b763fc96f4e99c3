// Several ranks on loopback (real server processes, Gloo between them) and several trainers
// (threads, each with its own client): the parameters after k steps are bit-identical for every
// world size (1-4), number of trainers (1-4), gradient mode and optimizer chain; an incomplete
// step is aborted on every rank together, also on a rank that never saw it; a trainer whose
// stream breaks before or after its commit resends, with the same result.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
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
const std::vector<std::vector<uint64_t>> kShapes = {{24, 16}, {24},     {16, 40}, {16},
                                                    {7, 3},   {40, 24}, {5}};

uint64_t Numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// A deterministic gradient value: a function of (step, trainer, param, element).
float GradientValue(int step, int trainer, int param, uint64_t i) {
  const uint64_t h = (uint64_t(step) * 1000003u + uint64_t(trainer) * 7919u +
                      uint64_t(param) * 104729u + i * 2654435761u) %
                     1000u;
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

// One group of each world size, started once for every case of this process (each case is a new
// session on it).
Group& SharedGroup(int world) {
  static auto* groups = new std::map<int, Group>();
  Group& group = (*groups)[world];
  if (group.empty()) {
    auto started = StartGroup(world);
    EXPECT_THAT(started.status(), IsOk());
    if (!started.ok()) return group;
    auto client = Client::Connect(Options(*started));
    EXPECT_THAT(client.status(), IsOk());
    if (client.ok()) {
      EXPECT_THAT(WaitServing(**client), IsOk());
    }
    group = *std::move(started);
  }
  return group;
}

// Runs `steps` steps with `trainers` concurrent trainers on a group of ranks and answers the final
// parameters (fp32 bits, concatenated). The session is closed again.
std::vector<float> Train(const Group* group, int trainers, v1::GradientMode mode,
                         const std::string& optimizer, int steps) {
  const int world = static_cast<int>(group->size());
  if (world == 0) return {};
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
    for (uint64_t i = 0; i < init.size(); ++i)
      init[i] = 0.01f * static_cast<float>((i * 7 + p) % 13);
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
          slice.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(grads[p].data()),
                                                  grads[p].size() * sizeof(float));
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
  for (auto& [id, param] : pulled->params)
    all.insert(all.end(), param.f32.begin(), param.f32.end());
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
        for (auto& [id, param] : copy->params) {
          mine.insert(mine.end(), param.f32.begin(), param.f32.end());
        }
        EXPECT_EQ(0, std::memcmp(mine.data(), all.data(), all.size() * sizeof(float)));
      }
    }
  }
  EXPECT_THAT((*client)->CloseSession(session->session_id()), IsOk());
  return all;
}

struct Case {
  v1::GradientMode mode;
  int trainers;
  const char* optimizer;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(info.param.mode == v1::GRADIENT_MODE_SHARDED ? "Sharded" : "Replicated",
                      info.param.trainers, "Trainers_", info.param.optimizer);
}

class MultiRankTest : public ::testing::TestWithParam<Case> {};

TEST_P(MultiRankTest, ParametersAreBitIdenticalForEveryWorldSize) {
  const Case c = GetParam();
  const std::vector<float> reference = Train(&SharedGroup(1), c.trainers, c.mode, c.optimizer, 3);
  ASSERT_FALSE(reference.empty());
  for (int world : {2, 3, 4}) {
    const std::vector<float> got = Train(&SharedGroup(world), c.trainers, c.mode, c.optimizer, 3);
    ASSERT_EQ(got.size(), reference.size()) << "world " << world;
    EXPECT_EQ(0, std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)))
        << "world " << world << " differs from world 1";
  }
}

// Every combination of 1-4 trainers x SHARDED/REPLICATED x (AdamW, the Muon chain, the SOAP
// chain), and SGD once.
std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (v1::GradientMode mode : {v1::GRADIENT_MODE_SHARDED, v1::GRADIENT_MODE_REPLICATED}) {
    for (int trainers = 1; trainers <= 4; ++trainers) {
      for (const char* optimizer : {"adam", "muon", "soap"}) {
        cases.push_back(Case{mode, trainers, optimizer});
      }
    }
  }
  cases.push_back(Case{v1::GRADIENT_MODE_REPLICATED, 3, "sgd"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, MultiRankTest, ::testing::ValuesIn(AllCases()), CaseName);

// SHARDED halves: trainer 0 sends the first half of every parameter, trainer 1 the rest.
std::vector<GradientSlice> HalfSlices(const std::vector<std::vector<float>>& grads, int trainer) {
  std::vector<GradientSlice> slices;
  for (uint32_t p = 0; p < grads.size(); ++p) {
    const uint64_t n = grads[p].size();
    const uint64_t begin = trainer == 0 ? 0 : n / 2, end = trainer == 0 ? n / 2 : n;
    GradientSlice s;
    s.param_id = p;
    s.offset = begin;
    s.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(grads[p].data() + begin),
                                        (end - begin) * sizeof(float));
    if (end > begin) slices.push_back(s);
  }
  return slices;
}

// Both trainers of a SHARDED session send their halves of `grads` for `step` at once.
void StepBothTrainers(const Group& group, const std::string& session_id, uint64_t step,
                      const std::vector<std::vector<float>>& grads) {
  std::vector<std::thread> trainers;
  std::vector<absl::Status> results(2);
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      auto trainer = Client::Connect(Options(group));
      if (!trainer.ok()) {
        results[t] = trainer.status();
        return;
      }
      StepOptions o;
      o.session_id = session_id;
      o.step = step;
      o.trainer_id = t;
      results[t] = (*trainer)->Step(o, HalfSlices(grads, t)).status();
    });
  }
  for (auto& t : trainers) t.join();
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], IsOk());
}

// Every rank is still at `step` with the parameters of `expected`.
void ExpectEveryRankAt(const Group& group, const std::string& session_id, uint64_t step,
                       const Parameters& expected) {
  for (const auto& rank : group) {
    ClientOptions one;
    one.target = rank->address();
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(one));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters after, c->PullParameters(session_id, DType::kF32));
    EXPECT_EQ(after.step, step);
    for (auto& [id, param] : after.params) EXPECT_EQ(param.f32, expected.params.at(id).f32);
  }
}

// A Step stream by hand, to break it where the client library would not: the header, then the
// fp32 `slices` of parameters owned by `rank` (of trainer `trainer`) to that rank, no commit.
// The Step header's fields that say what a RawStep gets back (fp32 parameters).
struct RawReturns {
  bool skip_return = false;
  bool return_owned = false;
};

class RawStep {
 public:
  RawStep(const Group& group, const v1::SessionInfo& session, int rank, uint64_t step, int trainer,
          const std::vector<GradientSlice>& slices, RawReturns returns = RawReturns()) {
    stub_ = v1::OptimizerService::NewStub(
        grpc::CreateChannel(group[rank]->address(), grpc::InsecureChannelCredentials()));
    stream_ = stub_->Step(&context_);
    v1::StepRequest header;
    header.mutable_header()->set_session_id(session.session_id());
    header.mutable_header()->set_step(step);
    header.mutable_header()->set_trainer_id(trainer);
    header.mutable_header()->set_skip_return(returns.skip_return);
    header.mutable_header()->set_return_owned(returns.return_owned);
    EXPECT_TRUE(stream_->Write(header));
    for (const GradientSlice& slice : slices) {
      if (session.layout().owner(slice.param_id) != static_cast<uint32_t>(rank)) continue;
      v1::StepRequest chunk;
      chunk.mutable_gradient()->set_param_id(slice.param_id);
      chunk.mutable_gradient()->set_offset(slice.offset);
      chunk.mutable_gradient()->set_dtype(v1::DTYPE_FP32);
      chunk.mutable_gradient()->set_data(slice.bytes.data(), slice.bytes.size());
      EXPECT_TRUE(stream_->Write(chunk));
    }
  }
  // Commits and half-closes.
  void Commit() {
    v1::StepRequest commit;
    commit.mutable_commit();
    EXPECT_TRUE(stream_->Write(commit));
    stream_->WritesDone();
  }
  // Reads the reply (once every rank's stream committed): the returned parameters' fp32 values
  // by id.
  absl::StatusOr<std::map<uint32_t, std::vector<float>>> Reply() {
    std::map<uint32_t, std::vector<float>> params;
    v1::StepResponse response;
    while (stream_->Read(&response)) {
      if (!response.has_parameter()) continue;
      const v1::TensorChunk& chunk = response.parameter();
      std::vector<float>& values = params[chunk.param_id()];
      values.resize(std::max<size_t>(values.size(), chunk.offset() + chunk.data().size() / 4));
      std::memcpy(values.data() + chunk.offset(), chunk.data().data(), chunk.data().size());
    }
    const grpc::Status status = stream_->Finish();
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return params;
  }
  // Waits for the server to end the stream.
  grpc::Status Finish() {
    v1::StepResponse response;
    while (stream_->Read(&response)) {
    }
    return stream_->Finish();
  }
  void Cancel() {
    context_.TryCancel();
    static_cast<void>(Finish());
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<v1::OptimizerService::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream_;
};

// A group of 2 ranks with a SHARDED 2-trainer AdamW session whose steps expire after 1 s, and
// its parameters before any step.
struct ShortDeadline {
  Group group;
  std::unique_ptr<Client> client;
  v1::SessionInfo session;
  Parameters before;
};

absl::StatusOr<ShortDeadline> StartShortDeadline(const std::vector<std::string>& args = {}) {
  ShortDeadline s;
  OPTSTEP_ASSIGN_OR_RETURN(s.group, StartGroup(2, args));
  OPTSTEP_ASSIGN_OR_RETURN(s.client, Client::Connect(Options(s.group)));
  OPTSTEP_RETURN_IF_ERROR(WaitServing(*s.client));
  v1::SessionSpec spec = Spec(2, v1::GRADIENT_MODE_SHARDED, "adam");
  spec.set_step_deadline_ms(1000);
  OPTSTEP_ASSIGN_OR_RETURN(s.session, s.client->CreateSession(spec));
  OPTSTEP_ASSIGN_OR_RETURN(s.before, s.client->PullParameters(s.session.session_id(), DType::kF32));
  return s;
}

TEST(MultiRankAbortTest, IncompleteStepIsAbortedOnEveryRankWithStateUnchanged) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShortDeadline s, StartShortDeadline());
  const Group& group = s.group;
  Client* client = s.client.get();
  const v1::SessionInfo& session = s.session;
  const Parameters& before = s.before;
  // Only trainer 0 of 2 sends its part: the step never completes.
  std::vector<std::vector<float>> grads;
  std::vector<FullGradient> full;
  for (uint32_t p = 0; p < kShapes.size(); ++p) grads.emplace_back(Numel(kShapes[p]), 0.5f);
  for (uint32_t p = 0; p < kShapes.size(); ++p) full.push_back({p, grads[p]});
  StepOptions options;
  options.session_id = session.session_id();
  options.step = 1;
  EXPECT_THAT(client->Step(options, full).status(),
              StatusIs(absl::StatusCode::kAborted, "redo the step"));
  // Both ranks are unchanged and still at step 0; the step can be redone by both trainers.
  ExpectEveryRankAt(group, session.session_id(), 0, before);
  StepBothTrainers(group, session.session_id(), 1, grads);
}

// A trainer that reached rank 0 only (it died before sending to rank 1): rank 1 never sees the
// step, yet when rank 0 votes to abort at the deadline, rank 1 joins the vote
// (PeerService.AbortStep) and both abort together within the deadline, not after the
// collectives' timeout.
TEST(MultiRankAbortTest, RankThatNeverSawTheStepAbortsWithTheOthers) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShortDeadline s, StartShortDeadline({"--comm_timeout_ms=60000"}));
  const Group& group = s.group;
  Client* client = s.client.get();
  const v1::SessionInfo& session = s.session;
  const Parameters& before = s.before;
  std::vector<std::vector<float>> grads;
  for (uint32_t p = 0; p < kShapes.size(); ++p) grads.emplace_back(Numel(kShapes[p]), 0.25f);
  RawStep only_rank0(group, session, 0, 1, 0, HalfSlices(grads, 0));
  absl::SleepFor(absl::Milliseconds(2500));  // rank 0 votes to abort 1 s after the header
  // Both ranks aborted together (without rank 1 in the vote, rank 0 would wait in the
  // collective until its 60 s timeout and then fail): the step is unchanged and can be redone.
  const absl::Time start = absl::Now();
  ExpectEveryRankAt(group, session.session_id(), 0, before);
  StepBothTrainers(group, session.session_id(), 1, grads);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  only_rank0.Cancel();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo after, client->GetSession(session.session_id()));
  EXPECT_EQ(after.step(), 1u);
}

// A trainer whose streams break before its commit, after part of its gradient reached the ranks,
// begins again and resends everything: the result is that of an undisturbed step, in both
// gradient modes (REPLICATED skips what was already summed).
TEST(MultiRankRetryTest, TrainerThatDisconnectsBeforeCommitResends) {
  for (v1::GradientMode mode : {v1::GRADIENT_MODE_SHARDED, v1::GRADIENT_MODE_REPLICATED}) {
    std::vector<float> runs[2];
    for (int disconnect = 0; disconnect < 2; ++disconnect) {
      SCOPED_TRACE(absl::StrCat("mode ", mode, " disconnect ", disconnect));
      const Group& group = SharedGroup(2);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(group)));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session,
                                   client->CreateSession(Spec(2, mode, "adam")));
      std::vector<std::vector<float>> grads[2];
      for (int t = 0; t < 2; ++t) {
        for (uint32_t p = 0; p < kShapes.size(); ++p) {
          grads[t].emplace_back(Numel(kShapes[p]));
          for (uint64_t i = 0; i < grads[t][p].size(); ++i)
            grads[t][p][i] = GradientValue(1, t, p, i);
        }
      }
      StepOptions options;
      options.session_id = session.session_id();
      options.step = 1;
      // SHARDED: each trainer's half of every parameter; REPLICATED: every gradient.
      std::vector<GradientSlice> slices[2];
      for (int t = 0; t < 2; ++t) {
        if (mode == v1::GRADIENT_MODE_SHARDED) {
          slices[t] = HalfSlices(grads[t], t);
          continue;
        }
        for (uint32_t p = 0; p < kShapes.size(); ++p) {
          GradientSlice all;
          all.param_id = p;
          all.bytes =
              absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(grads[t][p].data()),
                                        grads[t][p].size() * sizeof(float));
          slices[t].push_back(all);
        }
      }
      auto step = [&](int t) -> absl::StatusOr<StepReply> {
        OPTSTEP_ASSIGN_OR_RETURN(auto trainer, Client::Connect(Options(group)));
        StepOptions o = options;
        o.trainer_id = t;
        return trainer->Step(o, slices[t]);
      };
      // Trainer 0 first (REPLICATED: trainer 1's chunks are summed after its own).
      absl::StatusOr<StepReply> first;
      std::thread t0([&] { first = step(0); });
      if (disconnect) {
        absl::SleepFor(absl::Milliseconds(200));
        // Trainer 1 reaches both ranks with all it has for the parameters each owns, then its
        // streams break before the commit.
        for (int r = 0; r < 2; ++r) {
          RawStep broken(group, session, r, 1, 1, slices[1]);
          broken.Cancel();
        }
      }
      absl::StatusOr<StepReply> second = step(1);
      t0.join();
      ASSERT_THAT(first.status(), IsOk());
      ASSERT_THAT(second.status(), IsOk());
      for (auto& [id, param] : first->params) {
        runs[disconnect].insert(runs[disconnect].end(), param.f32.begin(), param.f32.end());
      }
      EXPECT_THAT(client->CloseSession(session.session_id()), IsOk());
    }
    ASSERT_FALSE(runs[0].empty());
    EXPECT_EQ(runs[0], runs[1]) << "mode " << mode;
  }
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
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        v1::SessionInfo session,
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

// What each rank returns: with return_owned (today's clients) the parameters it owns, under
// REPLICATED storage too, so that a trainer gets each from its owner as soon as it is stepped;
// without it (clients before return_owned) the trainer's home rank returns all of them and the
// others none (skip_return). Either way the values are those a pull answers after the step.
TEST(MultiRankReturnTest, EachRankReturnsItsOwnOrTheHomeRankEveryParameter) {
  const Group& group = SharedGroup(2);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(Options(group)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo session,
                               client->CreateSession(Spec(1, v1::GRADIENT_MODE_SHARDED, "adam")));
  for (uint64_t step = 1; step <= 2; ++step) {
    const bool owned = step == 1;
    SCOPED_TRACE(owned ? "return_owned" : "from the home rank");
    std::vector<std::vector<float>> grads;
    std::vector<GradientSlice> slices;
    for (uint32_t p = 0; p < kShapes.size(); ++p) {
      grads.emplace_back(Numel(kShapes[p]));
      for (uint64_t i = 0; i < grads[p].size(); ++i) grads[p][i] = GradientValue(step, 0, p, i);
    }
    for (uint32_t p = 0; p < kShapes.size(); ++p) {
      GradientSlice all;
      all.param_id = p;
      all.bytes = absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(grads[p].data()),
                                            grads[p].size() * sizeof(float));
      slices.push_back(all);
    }
    std::vector<std::unique_ptr<RawStep>> streams;
    for (int r = 0; r < 2; ++r) {
      RawReturns returns;
      returns.return_owned = owned;
      returns.skip_return = !owned && r != 0;  // trainer 0's home rank is rank 0
      streams.push_back(std::make_unique<RawStep>(group, session, r, step, 0, slices, returns));
    }
    for (auto& stream : streams) stream->Commit();
    std::map<uint32_t, std::vector<float>> by_rank[2];
    for (int r = 0; r < 2; ++r) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(by_rank[r], streams[r]->Reply());
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters pulled,
                                 client->PullParameters(session.session_id(), DType::kF32));
    for (uint32_t p = 0; p < kShapes.size(); ++p) {
      const int owner = static_cast<int>(session.layout().owner(p));
      const int from = owned ? owner : 0;
      SCOPED_TRACE(absl::StrCat("param ", p, " owned by rank ", owner));
      ASSERT_EQ(by_rank[from].count(p), 1u);
      EXPECT_EQ(by_rank[1 - from].count(p), 0u) << "returned twice";
      EXPECT_EQ(by_rank[from][p], pulled.params[p].f32);
    }
  }
  EXPECT_THAT(client->CloseSession(session.session_id()), IsOk());
}

}  // namespace
}  // namespace optstep
