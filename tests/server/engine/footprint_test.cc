// The footprint admission control counts is what a replica really holds: for every optimizer,
// the device's allocated bytes after creating a replica and stepping it through every branch
// (projections, refreshes, the KL preconditioner, the Q/K/V split) are at most the footprint and
// within a small margin of it; the host bytes per parameter bound what a session of many tiny
// parameters adds to the process; under OWNERS storage a rank counts (and holds) only its own
// masters, so that a session larger than one rank's budget is admitted by a group.

#include "server/engine/footprint.h"

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/partition.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "server/engine/admission.h"
#include "server/engine/cost_model.h"
#include "server/engine/engine.h"
#include "server/engine/replica_state.h"
#include "server/engine/step_contributions.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/sanitizer.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::MatricesAndTheRest;
using ::optstep::testutil::StatusIs;

ParamInfo Param(std::string name, Shape shape) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  return p;
}

// `main` steps the 2-D parameters, AdamW the others.
SessionConfig ConfigOf(SubOptimizerConfig main, std::vector<ParamInfo> params) {
  SessionConfig config;
  config.name = "footprint";
  config.params = std::move(params);
  main.name = "main";
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  config.chain = MatricesAndTheRest(main, adam);
  return config;
}

std::vector<ParamInfo> MixedParams() {
  return {Param("fc1.weight", {48, 32}), Param("fc1.bias", {48}), Param("fc2.weight", {16, 64}),
          Param("fc2.bias", {16}), Param("head.weight", {24, 24})};
}

struct Case {
  std::string label;
  SubOptimizerConfig main;
  std::vector<ParamInfo> params = MixedParams();
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // A case of `kind`, its other settings the defaults; the caller may change the case returned.
  auto add = [&cases](const std::string& label, const std::string& kind) -> Case& {
    cases.push_back(Case{label, {}});
    cases.back().main.kind = kind;
    return cases.back();
  };
  add("adamw", "adamw");
  add("sgd_momentum", "sgd").main.sgd.momentum = 0.9;
  add("sgd", "sgd").main.sgd.momentum = 0.0;
  add("lion", "lion");
  add("muon", "muon");
  add("muon_highest", "muon").main.muon.fp32_matmul_prec = "highest";
  ParamInfo fused = Param("attn.qkv.weight", {2 * (2 + 2) * 4, 32});  // 2 groups, 2 q heads, dim 4
  fused.qkv = QkvSplitInfo{2, 2, 4};
  add("muon_split_qkv", "muon").params.push_back(fused);
  add("adaptive_muon", "adaptive_muon");
  add("normuon", "adaptive_muon").main.adaptive_muon.moment2_method = "normuon";
  SoapConfig& soap = add("soap_kl", "soap").main.soap;
  soap.use_kl_shampoo = true;  // eigh at the first refresh, power iteration after
  soap.weight_decay_mode = WeightDecayMode::kL2;
  soap.weight_decay = 0.01;
  return cases;
}

class FootprintTest : public testing::TestWithParam<Case> {};

TEST_P(FootprintTest, DeviceBytesAfterEveryBranchAreWithinTheFootprint) {
  const Case& c = GetParam();
  const SessionConfig config = ConfigOf(c.main, c.params);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<double> costs,
                               EstimateStepCosts(config.chain, config.params));
  const Layout layout = PartitionByCost(costs, 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint footprint, ComputeFootprint(config, layout, 0));

  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<CpuDevice> device,
                               CpuDevice::Create(CpuDevice::Options{}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaState> replica,
                               ReplicaState::Create("s", config, layout, 0, 0, device));
  const ReplicaState::Bytes bytes = replica->bytes();
  EXPECT_EQ(bytes.params, footprint.masters);
  EXPECT_EQ(bytes.state, footprint.state);
  EXPECT_EQ(bytes.buffers, footprint.gradients);

  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    for (int p : replica->owned()) {
      std::vector<float> g(replica->numels()[p]);
      for (float& x : g) x = normal(random);
      ASSERT_THAT(device->CopyFromHost(g.data(), DType::kF32, g.size(), replica->grad(p), 0),
                  IsOk());
      GroupRuntime& group = replica->groups()[replica->group_of(p)];
      ASSERT_THAT(group.optimizer->Step(*device, StepArgs{1e-3, 0.01, step}, replica->grad(p),
                                        replica->param(p), replica->state(p)),
                  IsOk());
    }
  }
  const int64_t held = device->allocated_bytes();
  EXPECT_LE(held, footprint.device_bytes()) << footprint.Breakdown();
  // Every slot was used: the plan is the workspaces to within a few small vectors.
  EXPECT_GE(held, footprint.device_bytes() - footprint.device_bytes() / 50 - 1024)
      << footprint.Breakdown();
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FootprintTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

TEST(FootprintTest, OnlyOwnedParametersCarryStateGradientsAndWorkspace) {
  SubOptimizerConfig adamw;
  adamw.kind = "adamw";
  const SessionConfig config = ConfigOf(adamw, {Param("a", {100}), Param("b", {50})});
  Layout layout;
  layout.world_size = 2;
  layout.owner = {0, 1};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint rank1, ComputeFootprint(config, layout, 1));
  EXPECT_EQ(rank1.masters, 150 * 4);   // every rank holds every master
  EXPECT_EQ(rank1.state, 2 * 50 * 4);  // exp_avg and exp_avg_sq of "b"
  EXPECT_EQ(rank1.gradients, 50 * 4);
  EXPECT_EQ(rank1.overhead, kSessionOverheadBytes + 2 * kParamOverheadBytes + 2 * kParamNameCopies +
                                (2 + 3) * 8);  // names "a", "b"; votes
  EXPECT_EQ(rank1.total(), 600 + 400 + 200 + rank1.overhead);
}

TEST(FootprintTest, RedundancyAddsTheShadowOfThePredecessorsOwnedPart) {
  SubOptimizerConfig adamw;
  adamw.kind = "adamw";
  const SessionConfig config = ConfigOf(adamw, {Param("a", {100}), Param("b", {50})});
  Layout layout;
  layout.world_size = 2;
  layout.owner = {0, 1};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint plain, ComputeFootprint(config, layout, 1));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint redundant,
                               ComputeFootprint(config, layout, 1, /*state_redundancy=*/true));
  // Rank 1 shadows rank 0's "a": its master, exp_avg and exp_avg_sq, and its gradient buffer.
  EXPECT_EQ(redundant.shadow, 100 * 4 * 4);
  EXPECT_EQ(redundant.total(), plain.total() + redundant.shadow);
  EXPECT_THAT(redundant.Breakdown(), testing::HasSubstr(", shadow 1600"));
  EXPECT_EQ(plain.shadow, 0);
  // One rank has no buddy.
  Layout one;
  one.owner = {0, 0};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint alone,
                               ComputeFootprint(config, one, 0, /*state_redundancy=*/true));
  EXPECT_EQ(alone.shadow, 0);
}

TEST(FootprintTest, OwnersStorageCountsOnlyTheOwnedMastersAsTheReplicaHoldsThem) {
  SubOptimizerConfig adamw;
  adamw.kind = "adamw";
  SessionConfig config = ConfigOf(adamw, {Param("a", {100}), Param("b", {50})});
  config.storage = ParameterStorage::kOwners;
  Layout layout;
  layout.world_size = 2;
  layout.owner = {0, 1};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint rank1, ComputeFootprint(config, layout, 1));
  EXPECT_EQ(rank1.masters, 50 * 4);  // "b" only
  EXPECT_EQ(rank1.state, 2 * 50 * 4);
  EXPECT_EQ(rank1.gradients, 50 * 4);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<CpuDevice> device,
                               CpuDevice::Create(CpuDevice::Options{}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReplicaState> replica,
                               ReplicaState::Create("s", config, layout, 1, 0, device));
  EXPECT_EQ(replica->bytes().params, rank1.masters);
  EXPECT_FALSE(replica->holds(0));
  EXPECT_TRUE(replica->holds(1));
  EXPECT_FALSE(replica->holds_every_master());
  // A value for a master another rank holds is accepted and not kept.
  const std::vector<float> values(100, 1.0f);
  EXPECT_THAT(replica->WriteValues(0, 0, DType::kF32, values.data(), 100), IsOk());
}

// Four ranks, each owning one of four equal parameters: a budget below the model's masters
// admits the session on every rank when each keeps only what it owns, and refuses the full
// replica, naming its masters.
TEST(AdmissionTest, OwnersStorageAdmitsASessionLargerThanOneRankWithinTheGroup) {
  SubOptimizerConfig lion;  // 12 bytes per owned element: master, exp_avg, gradient
  lion.kind = "lion";
  SessionConfig replicated = ConfigOf(lion, {Param("a", {10, 100}), Param("b", {10, 100}),
                                             Param("c", {10, 100}), Param("d", {10, 100})});
  SessionConfig owners = replicated;
  owners.storage = ParameterStorage::kOwners;
  Layout layout;
  layout.world_size = 4;
  layout.owner = {0, 1, 2, 3};
  const int64_t model_masters = 4 * 1000 * 4;
  for (int rank = 0; rank < 4; ++rank) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint own, ComputeFootprint(owners, layout, rank));
    const int64_t budget = own.total();
    // What a rank must hold besides the fixed overhead is below the model's masters.
    ASSERT_LT(budget - own.overhead, model_masters);
    SessionAdmission admission(budget, 0, rank);
    EXPECT_THAT(
        admission.Admit(replicated, layout, "r").status(),
        StatusIs(absl::StatusCode::kResourceExhausted, absl::StrCat("masters ", model_masters)));
    auto admitted = admission.Admit(owners, layout, "o");
    EXPECT_THAT(admitted.status(), IsOk()) << "rank " << rank;
  }
}

// A stand-in for rank 1 runs in rank 2's process and shares its budget. Rank 0 asks both ranks
// at once whether they admit a session: each part alone fits in what is free, both do not. The
// stand-in's check counts the host's part beside its own, so the session is refused before any
// replica is built (before, both checks passed, and the replica refused as it was built left the
// other ranks waiting in the rendezvous).
TEST(AdmissionTest, AStandInsCheckCountsItsHostsPartBesideItsOwn) {
  SubOptimizerConfig lion;
  lion.kind = "lion";
  const SessionConfig config =
      ConfigOf(lion, {Param("a", {10, 100}), Param("b", {10, 100}), Param("c", {10, 100})});
  Layout layout;
  layout.world_size = 3;
  layout.owner = {0, 1, 2};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint host_part, ComputeFootprint(config, layout, 2));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint own_part, ComputeFootprint(config, layout, 1));
  SessionAdmission host(host_part.total() + own_part.total() - 1, 0, 2);
  SessionAdmission stand_in(host.budget(), 0, 1, /*state_redundancy=*/false);
  EXPECT_THAT(host.Check(config, layout, "s").status(), IsOk());
  EXPECT_THAT(stand_in.Check(config, layout, "s").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "and rank 2's part beside it"));
  // With a byte more, both parts fit, and both ranks admit it.
  SessionAdmission roomier(host_part.total() + own_part.total(), 0, 2);
  SessionAdmission roomier_stand_in(roomier.budget(), 0, 1, /*state_redundancy=*/false);
  // The bytes the stand-in answers are both parts: an owner's share holds both (before, only
  // its own, and an owner could pass its share by the host's part of each session).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(int64_t both, roomier_stand_in.Check(config, layout, "s"));
  EXPECT_EQ(both, host_part.total() + own_part.total());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(int64_t its_own, roomier.Check(config, layout, "s"));
  EXPECT_EQ(its_own, host_part.total());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation hosts, roomier.Admit(config, layout, "s"));
  EXPECT_THAT(roomier_stand_in.Admit(config, layout, "s").status(), IsOk());
}

TEST(FootprintTest, AHugeSoapFactorIsRefusedBeforeItIsCounted) {
  SubOptimizerConfig soap;
  soap.kind = "soap";
  const SessionConfig config = ConfigOf(soap, {Param("emb", {int64_t{1} << 30, 2})});
  Layout layout;
  layout.owner = {0};
  EXPECT_THAT(ComputeFootprint(config, layout, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'emb': soap takes dimensions up to 1048576"));
}

// The partition's estimates read a parameter's shape only once its optimizer accepted it: a 1-D
// parameter routed to SOAP or Muon is refused by name, before any cost or state size is read
// from a second dimension it does not have.
TEST(FootprintTest, TheLayoutEstimatesRefuseAParameterTheOptimizerCannotHandle) {
  for (const char* kind : {"soap", "muon"}) {
    SessionConfig config;
    config.params = {Param("w", {8, 8}), Param("bias", {8})};
    SubOptimizerConfig matrix;
    matrix.name = "matrix";
    matrix.kind = kind;
    config.chain.sub_optimizers = {matrix};
    RoutingRule every;
    every.sub_optimizer = "matrix";
    config.chain.rules = {every};
    const std::string refused = absl::StrCat("param 'bias': ", kind, " needs a 2-D parameter");
    EXPECT_THAT(EstimateOwnedBytes(config.chain, config.params).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, refused));
    EXPECT_THAT(EstimateStepCosts(config.chain, config.params).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, refused));
  }
}

// Hundreds of thousands of SOAP factors of the largest shape SOAP takes: each parameter's bytes
// fit in int64, but their sum does not. The estimates the partition adds up are clamped so that
// it stays within 2^62 (PartitionByCostAndMemory's REQUIRES): before, it overflowed (undefined),
// and the partition's search for a cap above that sum could loop for good on rank 0 while no
// other session could be created.
TEST(FootprintTest, TheOwnedBytesOfAHugeSessionAddUpWithinInt64) {
  SubOptimizerConfig soap;
  soap.kind = "soap";
  std::vector<ParamInfo> params;
  constexpr int kParams = 1 << 19;
  params.reserve(kParams);
  for (int p = 0; p < kParams; ++p) {
    params.push_back(Param(absl::StrCat("w", p), {int64_t{1} << 20, int64_t{1} << 20}));
  }
  const SessionConfig config = ConfigOf(soap, std::move(params));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<int64_t> bytes,
                               EstimateOwnedBytes(config.chain, config.params));
  int64_t total = 0;
  for (int64_t b : bytes) {
    ASSERT_GT(b, 0);
    ASSERT_LE(b, (int64_t{1} << 62) - total) << "the sum passes 2^62";
    total += b;
  }
}

// Resident set size of this process, from /proc/self/statm.
int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long size = 0;
  long resident = 0;
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<int64_t>(resident) * 4096;
}

// AdamW over `count` parameters of two elements ("layers.<i>"), every one owned by rank 0
// (`layout`).
SessionConfig TinyParamsConfig(int count, Layout* layout) {
  SubOptimizerConfig adamw;
  adamw.kind = "adamw";
  std::vector<ParamInfo> params;
  for (int i = 0; i < count; ++i) params.push_back(Param("layers." + std::to_string(i), {2}));
  layout->owner.assign(count, 0);
  return ConfigOf(adamw, std::move(params));
}

TEST(FootprintTest, ManyTinyParametersStayWithinTheirFootprintAndReturnAfterClose) {
  EngineOptions options;
  options.device.num_threads = 1;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(options));
  constexpr int kParams = 100000;
  Layout layout;
  SessionConfig config = TinyParamsConfig(kParams, &layout);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint footprint, ComputeFootprint(config, layout, 0));

  const int64_t before = ResidentBytes();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created created, engine->CreateSession(std::move(config)));
  const std::string id = created.session->id();
  created.session.reset();
  const int64_t grown = ResidentBytes() - before;
#ifdef OPTSTEP_UNDER_SANITIZER
  GTEST_SKIP() << "resident memory under a sanitizer is its allocator's, not the engine's";
#endif
  std::printf("%d tiny parameters: RSS +%lld bytes (%lld per parameter); footprint %lld\n", kParams,
              static_cast<long long>(grown), static_cast<long long>(grown / kParams),
              static_cast<long long>(footprint.total()));
  EXPECT_LE(grown, footprint.total());
  EXPECT_EQ(engine->memory_budget().admitted(), footprint.total());

  ASSERT_THAT(engine->CloseSession(id), IsOk());
  const int64_t after = ResidentBytes();
  std::printf("after close: RSS %+lld bytes from before the session\n",
              static_cast<long long>(after - before));
  EXPECT_EQ(engine->memory_budget().admitted(), 0);
  EXPECT_LE(after - before, 8 << 20);  // the heap went back to the system
}

TEST(FootprintTest, ATrainersRecordOfAParameterStaysWithinItsBytes) {
  // REPLICATED, several trainers: a step keeps what each trainer sent of each owned parameter.
  constexpr int kTrainers = 256, kParams = 2000;
  std::vector<std::string> names;
  for (int p = 0; p < kParams; ++p) names.push_back("layers." + std::to_string(p));
  const int64_t before = ResidentBytes();
  StepContributions contributions(GradientMode::kReplicated, kTrainers,
                                  std::vector<int64_t>(kParams, 2), &names);
  for (int t = 0; t < kTrainers; ++t) {
    for (int p = 0; p < kParams; ++p) ASSERT_THAT(contributions.AddRange(t, p, 0, 2), IsOk());
  }
  const int64_t grown = ResidentBytes() - before;
#ifdef OPTSTEP_UNDER_SANITIZER
  GTEST_SKIP() << "resident memory under a sanitizer is its allocator's, not the engine's";
#endif
  const int64_t per_record = grown / (kTrainers * kParams);
  std::printf("%d trainers x %d parameters: RSS +%lld bytes (%lld per record)\n", kTrainers,
              kParams, static_cast<long long>(grown), static_cast<long long>(per_record));
  EXPECT_LE(per_record, kTrainerParamRecordBytes);
}

TEST(FootprintTest, ManyTrainersOfManyParametersAreCountedAndRefusedBeyondTheBudget) {
  // REPLICATED with 4096 trainers and 20000 parameters: their records once every trainer sent
  // (5.2 GB here) were outside the footprint, and made up front at creation (4.6 GB).
  EngineOptions options;
  options.device.num_threads = 1;
  options.memory_budget = int64_t{4} << 30;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(options));
  constexpr int kParams = 20000;
  Layout layout;
  SessionConfig config = TinyParamsConfig(kParams, &layout);
  config.mode = GradientMode::kReplicated;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint one, ComputeFootprint(config, layout, 0));
  config.num_trainers = 4096;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionFootprint many, ComputeFootprint(config, layout, 0));
  EXPECT_EQ(many.host_bytes - one.host_bytes, int64_t{kParams} * 4096 * kTrainerParamRecordBytes);

  const int64_t before = ResidentBytes();
  EXPECT_THAT(engine->CreateSession(std::move(config)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_LE(ResidentBytes() - before, 64 << 20);
  EXPECT_EQ(engine->memory_budget().admitted(), 0);
}

}  // namespace
}  // namespace optstep
