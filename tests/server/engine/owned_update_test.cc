// The owned update steps a group's parameters in batches (Optimizer::StepBatch): PlanOwnedUpdate
// cuts each group's parameters into batches of at most the given bytes (a larger parameter
// alone, never across groups; one parameter per batch for an optimizer without a batched loop),
// and applying every batch with a clip scale gives the bits of the per-parameter update (scale,
// then Optimizer::Step), for AdamW (one device loop per batch, the clip folded into it) and Lion
// (one at a time, its gradient scaled first).

#include "server/engine/owned_update.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/partition.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "server/engine/cost_model.h"
#include "server/engine/replica_state.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::MatricesAndTheRest;
using ::testing::ElementsAre;

ParamInfo Param(std::string name, Shape shape) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  return p;
}

// AdamW steps the 2-D parameters, Lion the others.
SessionConfig Config() {
  SessionConfig config;
  config.name = "owned_update";
  config.params = {Param("w0", {128, 128}), Param("b0", {128}),       Param("w1", {128, 128}),
                   Param("w2", {128, 128}), Param("big", {256, 256}), Param("w3", {16, 16}),
                   Param("b1", {16})};
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  SubOptimizerConfig lion;
  lion.name = "lion";
  lion.kind = "lion";
  config.chain = MatricesAndTheRest(adam, lion);
  return config;
}

// 192 KiB: three 64 KiB matrices (49152 elements, over the device's parallel threshold).
constexpr int64_t kBatchBytes = 192 << 10;

class OwnedUpdateTest : public testing::Test {
 protected:
  void SetUp() override {
    CpuDevice::Options options;
    options.num_threads = 2;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(device_, CpuDevice::Create(options));
  }

  // A replica of Config() on one rank, its parameters and gradients random from `seed`.
  std::unique_ptr<ReplicaState> MakeReplica(uint32_t seed) {
    const SessionConfig config = Config();
    std::vector<double> costs = *EstimateStepCosts(config.chain, config.params);
    std::unique_ptr<ReplicaState> replica =
        *ReplicaState::Create("s", config, PartitionByCost(costs, 1), 0, 0, device_);
    std::mt19937 random(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int p : replica->owned()) {
      std::vector<float> values(replica->numels()[p]);
      for (float& x : values) x = normal(random);
      EXPECT_THAT(replica->WriteValues(p, 0, DType::kF32, values.data(), values.size()), IsOk());
      for (float& x : values) x = normal(random);
      EXPECT_THAT(
          device_->CopyFromHost(values.data(), DType::kF32, values.size(), replica->grad(p), 0),
          IsOk());
    }
    return replica;
  }

  std::vector<float> Host(const Tensor& x) {
    std::vector<float> out(x.numel());
    EXPECT_THAT(device_->CopyToHost(x, 0, x.numel(), DType::kF32, out.data()), IsOk());
    return out;
  }

  std::shared_ptr<CpuDevice> device_;
};

TEST(BatchLengthsTest, CutsRunsOfAtMostTheBytes) {
  EXPECT_THAT(BatchLengths({}, 100), ElementsAre());
  EXPECT_THAT(BatchLengths({40, 60, 1, 100, 250, 30, 30}, 100), ElementsAre(2, 1, 1, 1, 2));
  EXPECT_THAT(BatchLengths({40, 60, 1}, 0), ElementsAre(1, 1, 1));
  EXPECT_THAT(BatchLengths({40, 60, 1}, 1000), ElementsAre(3));
}

TEST_F(OwnedUpdateTest, BatchesAGroupsParametersUpToTheBytes) {
  std::unique_ptr<ReplicaState> replica = MakeReplica(1);
  const OwnedUpdate update = PlanOwnedUpdate(*replica, replica->DefaultSchedule(), kBatchBytes);
  std::vector<std::vector<std::string>> names;
  std::vector<std::string> kinds;
  for (const OwnedBatch& batch : update.work) {
    names.emplace_back();
    for (int p : batch.params) names.back().push_back(replica->names()[p]);
    kinds.push_back(replica->groups()[batch.group].optimizer->kind());
  }
  EXPECT_THAT(names, ElementsAre(ElementsAre("w0", "w1", "w2"), ElementsAre("big"),
                                 ElementsAre("w3"), ElementsAre("b0"), ElementsAre("b1")));
  EXPECT_THAT(kinds, ElementsAre("adamw", "adamw", "adamw", "lion", "lion"));
  // The engine's bound puts AdamW's in one batch; Lion has no batched loop.
  EXPECT_EQ(PlanOwnedUpdate(*replica, replica->DefaultSchedule()).work.size(), 3u);
}

TEST_F(OwnedUpdateTest, BatchedStepsGiveThePerParameterBits) {
  constexpr double kClip = 0.5;
  std::unique_ptr<ReplicaState> batched = MakeReplica(2);
  std::unique_ptr<ReplicaState> reference = MakeReplica(2);
  std::vector<std::vector<float>> grads;  // each step's gradients, as the trainers send them
  for (int p : batched->owned()) grads.push_back(Host(batched->grad(p)));
  for (int step = 1; step <= 2; ++step) {
    for (ReplicaState* replica : {batched.get(), reference.get()}) {
      for (size_t i = 0; i < grads.size(); ++i) {
        ASSERT_THAT(device_->CopyFromHost(grads[i].data(), DType::kF32, grads[i].size(),
                                          replica->grad(replica->owned()[i]), 0),
                    IsOk());
      }
    }
    const OwnedUpdate update = PlanOwnedUpdate(*batched, batched->DefaultSchedule(), kBatchBytes);
    for (int i = 0; i < static_cast<int>(update.work.size()); ++i) {
      ASSERT_THAT(ApplyOwnedItem(*batched, update, i, kClip), IsOk());
    }
    CountOwnedUpdate(*batched);
    for (const OwnedBatch& batch : update.work) {
      for (int p : batch.params) {
        ASSERT_THAT(device_->Scale(static_cast<float>(kClip), reference->grad(p)), IsOk());
        ASSERT_THAT(reference->groups()[batch.group].optimizer->Step(
                        *device_, update.args[batch.group], reference->grad(p), reference->param(p),
                        reference->state(p)),
                    IsOk());
      }
    }
  }
  for (int p : batched->owned()) {
    const std::string& name = batched->names()[p];
    const std::vector<float> got = Host(batched->param(p)), want = Host(reference->param(p));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << name;
    ParamState& state = batched->state(p);
    for (size_t k = 0; k < state.tensors.size(); ++k) {
      const std::vector<float> a = Host(state.tensors[k].second);
      const std::vector<float> b = Host(reference->state(p).tensors[k].second);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
          << name << " " << state.tensors[k].first;
    }
  }
}

}  // namespace
}  // namespace optstep
