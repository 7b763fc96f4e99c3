// SnapshotPool: a step's snapshot takes the storage of the last step's once nothing else holds
// that any more (no allocation, no page faults for the returned parameters), and a fresh one
// otherwise; either way, once every parameter is copied in, it holds what BuildSnapshot builds.
// Partial snapshots (REPLICATED, owned parameters only) are their own kind.

#include "server/engine/snapshot_pool.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/partition.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "server/engine/replica_snapshot.h"
#include "server/engine/replica_state.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;

// Every master `replica` holds, converted to `dtype`, copied in one pass: the snapshot a pooled
// one must equal once every parameter is copied in.
absl::StatusOr<std::shared_ptr<const ParamSnapshot>> BuildSnapshot(ReplicaState& replica,
                                                                   DType dtype, uint64_t step) {
  std::unique_ptr<ParamSnapshot> snapshot = EmptySnapshot(replica, dtype, step);
  for (int p = 0; p < replica.num_params(); ++p) {
    const absl::Status copied = CopyToSnapshot(replica, p, *snapshot);
    if (!copied.ok()) return copied;
  }
  return std::shared_ptr<const ParamSnapshot>(std::move(snapshot));
}

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

class SnapshotPoolTest : public testing::Test {
 protected:
  void SetUp() override {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(device_, CpuDevice::Create(CpuDevice::Options()));
    // Two ranks: rank 0 holds both masters (REPLICATED) and owns one of them.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        replica_,
        ReplicaState::Create("s", Config(), PartitionByCost({2.0, 1.0}, 2), 0, 0, device_));
    ASSERT_EQ(replica_->owned().size(), 1u);
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
  SnapshotPool pool_;
};

TEST_F(SnapshotPoolTest, ASnapshotReleasedEverywhereLendsItsStorageToTheNext) {
  std::shared_ptr<ParamSnapshot> last = pool_.Make(*replica_, DType::kBF16, 1, false);
  Fill(*last);
  const ParamSnapshot* object = last.get();
  const char* bytes = last->values[0].data();
  std::shared_ptr<const ParamSnapshot> stream = last;  // a stream still sends from it
  last.reset();
  EXPECT_EQ(pool_.kept(), 0u);
  stream.reset();  // its last reference, as a stream thread drops it
  EXPECT_EQ(pool_.kept(), 1u);

  SetMasters(-3.0f);
  std::shared_ptr<ParamSnapshot> next = pool_.Make(*replica_, DType::kBF16, 2, false);
  EXPECT_EQ(next.get(), object);
  EXPECT_EQ(next->values[0].data(), bytes);
  EXPECT_EQ(next->step, 2u);
  EXPECT_EQ(next->readiness, nullptr);
  EXPECT_EQ(pool_.kept(), 0u);
  Fill(*next);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> built,
                               BuildSnapshot(*replica_, DType::kBF16, 2));
  EXPECT_EQ(next->values, built->values);
}

TEST_F(SnapshotPoolTest, ASnapshotStillHeldOrOfAnotherKindIsNotReused) {
  std::shared_ptr<ParamSnapshot> held = pool_.Make(*replica_, DType::kBF16, 1, false);
  Fill(*held);
  const std::vector<std::string> sent = held->values;
  std::shared_ptr<ParamSnapshot> next = pool_.Make(*replica_, DType::kBF16, 2, false);
  EXPECT_NE(next.get(), held.get());
  SetMasters(7.0f);
  Fill(*next);
  EXPECT_EQ(held->values, sent) << "the snapshot a stream reads was written";

  next.reset();  // kept: bf16, whole
  std::shared_ptr<ParamSnapshot> fp32 = pool_.Make(*replica_, DType::kF32, 3, false);
  std::shared_ptr<ParamSnapshot> partial = pool_.Make(*replica_, DType::kBF16, 3, true);
  EXPECT_EQ(pool_.kept(), 1u) << "reused for another dtype or a partial snapshot";
  Fill(*fp32);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const ParamSnapshot> built,
                               BuildSnapshot(*replica_, DType::kF32, 3));
  EXPECT_EQ(fp32->values, built->values);

  // A partial snapshot has the owned parameter's value only, and is reused as such.
  const int owned = replica_->owned()[0];
  Fill(*partial);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(built, BuildSnapshot(*replica_, DType::kBF16, 3));
  for (int p = 0; p < replica_->num_params(); ++p) {
    EXPECT_EQ(partial->values[p], p == owned ? built->values[p] : "") << "param " << p;
  }
  const ParamSnapshot* object = partial.get();
  partial.reset();
  EXPECT_EQ(pool_.Make(*replica_, DType::kBF16, 4, true).get(), object);

  pool_.Trim();
  EXPECT_EQ(pool_.kept(), 0u);
}

TEST(SnapshotPoolLifetimeTest, ASnapshotThatOutlivesItsPoolIsFreed) {
  std::shared_ptr<CpuDevice> device = *CpuDevice::Create(CpuDevice::Options());
  std::unique_ptr<ReplicaState> replica =
      *ReplicaState::Create("s", Config(), PartitionByCost({1.0, 1.0}, 1), 0, 0, device);
  std::shared_ptr<ParamSnapshot> snapshot;
  {
    SnapshotPool pool;
    snapshot = pool.Make(*replica, DType::kF32, 1, false);
  }
  snapshot.reset();  // no pool to go back to: freed (leak checkers would see otherwise)
}

}  // namespace
}  // namespace optstep
