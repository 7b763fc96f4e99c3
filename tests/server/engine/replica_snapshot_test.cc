// ReuseOrEmptySnapshot: a step's snapshot takes the storage of the last step's when nothing else
// holds that any more (no allocation, no page faults for the returned parameters), and a fresh
// one otherwise; either way, once every parameter is copied in, it holds what BuildSnapshot
// builds.

#include "server/engine/replica_snapshot.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/partition.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "server/engine/replica_state.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;

SessionConfig Config() {
  SessionConfig config;
  config.name = "snapshots";
  for (auto [name, shape] : {std::pair<std::string, Shape>{"w", {64, 32}}, {"b", {32}}}) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    config.params.push_back(p);
  }
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  config.chain.sub_optimizers = {adam};
  RoutingRule all;
  all.sub_optimizer = "adam";
  config.chain.rules = {all};
  return config;
}

class ReplicaSnapshotTest : public testing::Test {
 protected:
  void SetUp() override {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(device_, CpuDevice::Create(CpuDevice::Options()));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        replica_,
        ReplicaState::Create("s", Config(), PartitionByCost({1.0, 1.0}, 1), 0, 0, device_));
    SetMasters(1.0f);
  }

  void SetMasters(float base) {
    for (int p = 0; p < replica_->num_params(); ++p) {
      std::vector<float> values(replica_->numels()[p]);
      for (size_t i = 0; i < values.size(); ++i) values[i] = base + 0.5f * i - p;
      ASSERT_THAT(replica_->WriteValues(p, 0, DType::kF32, values.data(), values.size()), IsOk());
    }
  }

  // Fills `snapshot` from the masters, as a step does parameter by parameter.
  void Fill(ParamSnapshot& snapshot) {
    for (int p = 0; p < replica_->num_params(); ++p) {
      ASSERT_THAT(CopyToSnapshot(*replica_, p, snapshot), IsOk());
    }
  }

  std::shared_ptr<CpuDevice> device_;
  std::unique_ptr<ReplicaState> replica_;
};

TEST_F(ReplicaSnapshotTest, TheLastSnapshotsStorageIsReusedWhenNothingElseHoldsIt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> last,
                               BuildSnapshot(*replica_, DType::kBF16, 1));
  const ParamSnapshot* object = last.get();
  const char* bytes = last->values[0].data();
  SetMasters(-3.0f);
  std::shared_ptr<ParamSnapshot> next =
      ReuseOrEmptySnapshot(std::move(last), *replica_, DType::kBF16, 2);
  EXPECT_EQ(next.get(), object);
  EXPECT_EQ(next->values[0].data(), bytes);
  EXPECT_EQ(next->step, 2u);
  EXPECT_EQ(next->readiness, nullptr);
  Fill(*next);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> built,
                               BuildSnapshot(*replica_, DType::kBF16, 2));
  EXPECT_EQ(next->values, built->values);
}

TEST_F(ReplicaSnapshotTest, ASnapshotStillHeldOrOfAnotherDtypeIsNotReused) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> last,
                               BuildSnapshot(*replica_, DType::kBF16, 1));
  const std::vector<std::string> sent = last->values;
  std::shared_ptr<const ParamSnapshot> stream = last;  // a stream still sends from it
  SetMasters(7.0f);
  std::shared_ptr<ParamSnapshot> next = ReuseOrEmptySnapshot(last, *replica_, DType::kBF16, 2);
  EXPECT_NE(next.get(), stream.get());
  Fill(*next);
  EXPECT_EQ(stream->values, sent) << "the snapshot a stream reads was written";
  EXPECT_EQ(stream->step, 1u);
  last.reset();

  std::shared_ptr<ParamSnapshot> fp32 =
      ReuseOrEmptySnapshot(std::move(stream), *replica_, DType::kF32, 2);
  ASSERT_EQ(fp32->values[0].size(), replica_->numels()[0] * 4);
  Fill(*fp32);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> built,
                               BuildSnapshot(*replica_, DType::kF32, 2));
  EXPECT_EQ(fp32->values, built->values);
  EXPECT_EQ(ReuseOrEmptySnapshot(nullptr, *replica_, DType::kF32, 3)->values.size(), 2u);
}

}  // namespace
}  // namespace optstep
