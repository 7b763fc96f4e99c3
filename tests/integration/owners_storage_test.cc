// Parameter storage OWNERS (docs/design.md §4 "Parameter storage"): four ranks, each with a
// memory budget below the model's fp32 master bytes, admit a session that REPLICATED storage
// refuses, step it bit-identically to one large rank, answer PullParameters and a state dict
// export from the owners, save it and load it again (into four ranks of the same budget and
// into one rank). With state redundancy, a rank killed in the middle of a step (after it and its
// peers stepped, before the step's end) is healed in and the step redone, ending bit for bit with
// the one rank; under both storages, so that the shadows start from the initial values
// InitParameters wrote. Real server processes on loopback, port 0.

#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/healing_group.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::StartGroup;
using ::optstep::testutil::StatusIs;

// Eight matrices of 256 x 512: 4 MiB of fp32 masters. With Lion (one state tensor) a rank
// owning two of them holds 3 MiB of masters, state and gradients, plus its fixed overhead.
constexpr int kParams = 8;
constexpr uint64_t kRows = 256, kCols = 512, kNumel = kRows * kCols;
constexpr int64_t kMasterBytes = int64_t{kParams} * kNumel * 4;
// Below the masters alone: no rank can hold a full replica.
constexpr int64_t kBudget = kMasterBytes * 7 / 8;

float GradientValue(int step, int param, uint64_t i) {
  const uint64_t h =
      (uint64_t(step) * 1000003u + uint64_t(param) * 104729u + i * 2654435761u) % 1000u;
  return (static_cast<float>(h) - 500.0f) / 997.0f;
}

v1::SessionSpec Spec(v1::ParameterStorage storage) {
  v1::SessionSpec spec;
  for (int p = 0; p < kParams; ++p) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(absl::StrCat("layers.", p, ".weight"));
    param->add_shape(kRows);
    param->add_shape(kCols);
  }
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.set_step_deadline_ms(30000);
  spec.mutable_optimizer()->set_preset("lion");
  spec.set_parameter_storage(storage);
  return spec;
}

struct Running {
  std::vector<std::unique_ptr<ServerProcess>> group;
  std::unique_ptr<Client> client;
  std::string session;
};

// A client of `run.group`, once rank 0 serves.
absl::Status Connect(Running& run) {
  ClientOptions options;
  for (const auto& rank : run.group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  options.recovery_timeout = absl::Seconds(60);
  OPTSTEP_ASSIGN_OR_RETURN(run.client, Client::Connect(options));
  return testutil::WaitServing(*run.client);
}

// `world` ranks with `args` and a client, once rank 0 serves.
absl::StatusOr<Running> Start(int world, std::vector<std::string> args) {
  Running run;
  OPTSTEP_ASSIGN_OR_RETURN(run.group, StartGroup(world, args));
  OPTSTEP_RETURN_IF_ERROR(Connect(run));
  return run;
}

// Rank `rank` of `world` with `args`, on `port` (0: any), joining through rank 0 of `run`.
absl::StatusOr<std::unique_ptr<ServerProcess>> StartRank(const Running& run, int rank, int world,
                                                         std::vector<std::string> args,
                                                         const std::string& port = "0") {
  args.push_back(absl::StrCat("--rank=", rank));
  args.push_back(absl::StrCat("--world_size=", world));
  args.push_back("--port=" + port);
  if (rank > 0) args.push_back("--rendezvous=" + run.group[0]->address());
  return ServerProcess::Start(args);
}

// A session of `storage` on `run`, with initial values unless `init` is false.
absl::Status Create(Running& run, v1::ParameterStorage storage, bool init = true) {
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, run.client->CreateSession(Spec(storage)));
  run.session = info.session_id();
  for (uint32_t p = 0; p < kParams && init; ++p) {
    std::vector<float> values(kNumel);
    for (uint64_t i = 0; i < kNumel; ++i) values[i] = 0.01f * static_cast<float>((i * 7 + p) % 13);
    OPTSTEP_RETURN_IF_ERROR(run.client->InitParameters(run.session, p, values));
  }
  return absl::OkStatus();
}

// Step `step`; answers the returned parameters' fp32 bits, concatenated in id order.
absl::StatusOr<std::string> Step(Running& run, int step) {
  std::vector<std::vector<float>> grads(kParams);
  std::vector<FullGradient> full;
  for (uint32_t p = 0; p < kParams; ++p) {
    for (uint64_t i = 0; i < kNumel; ++i) grads[p].push_back(GradientValue(step, p, i));
    full.push_back({p, grads[p]});
  }
  StepOptions options;
  options.session_id = run.session;
  options.step = step;
  OPTSTEP_ASSIGN_OR_RETURN(StepReply reply, run.client->Step(options, full));
  if (reply.params.size() != kParams) {
    return absl::InternalError(absl::StrCat("step ", step, " returned ", reply.params.size(),
                                            " of ", kParams, " parameters"));
  }
  return testutil::FlatParams(reply.params);
}

absl::StatusOr<std::string> Pulled(Running& run) {
  return testutil::Pulled(*run.client, run.session);
}

absl::StatusOr<std::map<std::string, std::string>> Exported(Running& run) {
  return testutil::ExportedState(*run.client, run.session);
}

TEST(OwnersStorageTest, FourRanksBelowTheMastersServeTheModelAsOneLargeRank) {
  testutil::ScopedTempDir root("optstep-owners");
  std::map<int, std::string> reference;  // step -> parameters on one rank (REPLICATED)
  std::map<std::string, std::string> reference_state;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running one, Start(1, {}));
    ASSERT_THAT(Create(one, v1::PARAMETER_STORAGE_REPLICATED), IsOk());
    for (int step = 1; step <= 5; ++step) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(reference[step], Step(one, step));
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference_state, Exported(one));
  }
  const std::vector<std::string> args = {absl::StrCat("--memory_budget=", kBudget),
                                         "--state_redundancy=0",
                                         "--checkpoint_root=" + root.path()};
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running four, Start(4, args));
    // A full replica per rank does not fit: refused before anything is allocated.
    EXPECT_THAT(Create(four, v1::PARAMETER_STORAGE_REPLICATED),
                StatusIs(absl::StatusCode::kResourceExhausted, "masters 4194304"));
    ASSERT_THAT(Create(four, v1::PARAMETER_STORAGE_OWNERS), IsOk());
    for (int step = 1; step <= 3; ++step) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string params, Step(four, step));
      EXPECT_TRUE(params == reference[step]) << "step " << step;
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, Pulled(four));
    EXPECT_TRUE(pulled == reference[3]);
    // A pull of some parameters asks only their owners.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters some,
                                 four.client->PullParameters(four.session, DType::kF32, {6, 1}));
    ASSERT_EQ(some.params.size(), 2u);
    EXPECT_EQ(some.step, 3u);
    EXPECT_TRUE(testutil::FlatParams(some.params) ==
                reference[3].substr(kNumel * 4, kNumel * 4) +
                    reference[3].substr(6 * kNumel * 4, kNumel * 4));
    ASSERT_THAT(four.client->Save(four.session, "owners").status(), IsOk());
    for (int step = 4; step <= 5; ++step) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string params, Step(four, step));
      EXPECT_TRUE(params == reference[step]) << "step " << step;
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto state, Exported(four));
    EXPECT_TRUE(state == reference_state);
  }
  // Loaded into four fresh ranks of the same budget, and into one rank: both continue as the
  // reference did.
  for (int world : {4, 1}) {
    std::vector<std::string> flags = args;
    if (world == 1) flags = {"--checkpoint_root=" + root.path()};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, Start(world, flags));
    ASSERT_THAT(Create(run, v1::PARAMETER_STORAGE_OWNERS, /*init=*/false), IsOk());
    auto loaded = run.client->Load(run.session, "owners");
    ASSERT_THAT(loaded.status(), IsOk()) << "world " << world;
    EXPECT_EQ(loaded->step(), 3u);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, Pulled(run));
    EXPECT_TRUE(pulled == reference[3]) << "world " << world;
    for (int step = 4; step <= 5; ++step) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string params, Step(run, step));
      EXPECT_TRUE(params == reference[step]) << "world " << world << " step " << step;
    }
  }
}

// One rank REPLICATED, steps 1..kSteps: each step's returned parameters and the final state.
constexpr int kSteps = 4;
struct Reference {
  std::map<int, std::string> params;
  std::map<std::string, std::string> state;
};
absl::StatusOr<Reference> OneRank() {
  Reference reference;
  OPTSTEP_ASSIGN_OR_RETURN(Running one, Start(1, {}));
  OPTSTEP_RETURN_IF_ERROR(Create(one, v1::PARAMETER_STORAGE_REPLICATED));
  for (int step = 1; step <= kSteps; ++step) {
    OPTSTEP_ASSIGN_OR_RETURN(reference.params[step], Step(one, step));
  }
  OPTSTEP_ASSIGN_OR_RETURN(reference.state, Exported(one));
  return reference;
}

struct KilledMidStep {
  v1::ParameterStorage storage;
  int dead;  // the rank killed (rank 0 heals itself in)
};
class KilledMidStepTest : public ::testing::TestWithParam<KilledMidStep> {};

// Four ranks with state redundancy; rank 2 (or rank 0) kills itself in step 2, after every rank
// stepped its own parameters and shipped their gradients to its buddy, before the step's last
// collective (the all-gather, or under OWNERS the barrier): the others are interrupted, the rank
// is healed in and the step redone. The masters it takes back come from its buddy's shadow, which
// must start from the initial values (sent to it alone under OWNERS). state_redundancy_test covers
// a loss in the ring itself, which under OWNERS only the barrier makes every rank see.
TEST_P(KilledMidStepTest, ARankKilledInAStepIsHealedInAndTheRedoneStepIsBitIdentical) {
  constexpr int kWorld = 4, kKilledStep = 2;
  const int dead = GetParam().dead;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Reference reference, OneRank());
  const std::vector<std::string> flags = testutil::HealingFlags();
  Running run;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> args = flags;
    if (r == dead) args.push_back(absl::StrCat("--kill_before_allgather=", kKilledStep));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServerProcess> rank,
                                 StartRank(run, r, kWorld, args));
    run.group.push_back(std::move(rank));
  }
  ASSERT_THAT(Connect(run), IsOk());
  ASSERT_THAT(Create(run, GetParam().storage), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string first, Step(run, 1));
  EXPECT_TRUE(first == reference.params[1]);
  // The trainer's recovery waits for the group to heal and redoes the step.
  absl::StatusOr<std::string> redone = absl::UnknownError("not run");
  std::thread step([&] { redone = Step(run, kKilledStep); });
  const int status = run.group[dead]->Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  const std::string& address = run.group[dead]->address();
  auto restarted = StartRank(run, dead, kWorld, flags, address.substr(address.rfind(':') + 1));
  ASSERT_THAT(restarted.status(), IsOk());
  run.group[dead] = *std::move(restarted);
  step.join();
  ASSERT_THAT(redone.status(), IsOk());
  EXPECT_TRUE(*redone == reference.params[kKilledStep]);
  for (int s = kKilledStep + 1; s <= kSteps; ++s) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string params, Step(run, s));
    EXPECT_TRUE(params == reference.params[s]) << "step " << s;
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto state, Exported(run));
  EXPECT_TRUE(state == reference.state) << "the state after the heal differs";
}

INSTANTIATE_TEST_SUITE_P(StorageAndRank, KilledMidStepTest,
                         ::testing::Values(KilledMidStep{v1::PARAMETER_STORAGE_OWNERS, 2},
                                           KilledMidStep{v1::PARAMETER_STORAGE_REPLICATED, 2},
                                           KilledMidStep{v1::PARAMETER_STORAGE_OWNERS, 0}),
                         [](const ::testing::TestParamInfo<KilledMidStep>& info) {
                           return absl::StrCat(info.param.storage == v1::PARAMETER_STORAGE_OWNERS
                                                   ? "Owners"
                                                   : "Replicated",
                                               "Rank", info.param.dead);
                         });

}  // namespace
}  // namespace optstep
