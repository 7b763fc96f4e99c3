// SnapshotRetention: the snapshots of a session that streams still hold once the session stepped
// on stay in the rank's headroom, two of each kind (the current and the last step's); each older
// one takes its bytes from the rank's budget as its owner's until it is freed, and one that does
// not fit is let go (its streams end at their next chunk). Before, a tenant's slow streams could
// hold a snapshot of every step outside every budget.

#include "server/engine/snapshot_retention.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::StatusIs;

std::shared_ptr<const ParamSnapshot> Snapshot(uint64_t step, DType dtype, int64_t bytes) {
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->step = step;
  snapshot->dtype = dtype;
  snapshot->values = {std::string(static_cast<size_t>(bytes), '\0')};
  return snapshot;
}

SnapshotRetention::Reserve From(MemoryBudget& budget) {
  return [&budget](int64_t bytes) { return budget.TryReserve(bytes, "held", "x", "owner"); };
}

TEST(SnapshotRetentionTest, SnapshotsHeldBeyondTheHeadroomAreChargedUntilFreed) {
  MemoryBudget budget(1000, 0);
  SnapshotRetention retention("s", From(budget));
  std::vector<std::shared_ptr<const ParamSnapshot>> held;
  for (uint64_t step = 1; step <= 4; ++step) {
    held.push_back(Snapshot(step, DType::kF32, 100 * step));
    retention.Track(held.back());
  }
  // Steps 1 and 2 are past the headroom of two.
  EXPECT_EQ(held[0]->hold->charged(), 100);
  EXPECT_EQ(held[1]->hold->charged(), 200);
  EXPECT_EQ(held[2]->hold->charged(), 0);
  EXPECT_EQ(held[3]->hold->charged(), 0);
  EXPECT_EQ(budget.admitted(), 300);
  EXPECT_EQ(budget.HeldBy("owner"), 300);
  held[0].reset();  // its stream ended
  EXPECT_EQ(budget.admitted(), 200);
  EXPECT_EQ(retention.held(), 3);
}

TEST(SnapshotRetentionTest, ASnapshotThatDoesNotFitIsLetGo) {
  MemoryBudget budget(150, 0);
  SnapshotRetention retention("s", From(budget));
  std::vector<std::shared_ptr<const ParamSnapshot>> held;
  for (uint64_t step = 1; step <= 4; ++step) {
    held.push_back(Snapshot(step, DType::kF32, 100));
    retention.Track(held.back());
  }
  EXPECT_THAT(held[0]->hold->Check(), IsOk());
  EXPECT_EQ(held[0]->hold->charged(), 100);
  EXPECT_THAT(held[1]->hold->Check(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "session 's': the parameters of step 2 were let go before this stream took "
                       "them all: the session stepped on to step 4"));
  EXPECT_EQ(budget.admitted(), 100);
  EXPECT_THAT(held[3]->hold->Check(), IsOk());
}

TEST(SnapshotRetentionTest, EachKindHasItsHeadroomAndFreedSnapshotsCostNothing) {
  MemoryBudget budget(1000, 0);
  SnapshotRetention retention("s", From(budget));
  auto f32 = Snapshot(1, DType::kF32, 100);
  retention.Track(f32);
  auto bf16 = Snapshot(1, DType::kBF16, 50);
  retention.Track(bf16);
  retention.Track(Snapshot(2, DType::kBF16, 50));  // freed at once: a stream read it all
  auto third = Snapshot(3, DType::kBF16, 50);
  retention.Track(third);
  EXPECT_EQ(bf16->hold->charged(), 0) << "two of its kind held";
  retention.Track(Snapshot(4, DType::kBF16, 50));
  EXPECT_EQ(f32->hold->charged(), 0) << "one of its kind";
  EXPECT_EQ(bf16->hold->charged(), 50);
  EXPECT_EQ(budget.admitted(), 50);
  SnapshotRetention free_of_charge("s", nullptr);
  auto old = Snapshot(1, DType::kF32, 100);
  free_of_charge.Track(old);
  for (uint64_t step = 2; step <= 4; ++step) free_of_charge.Track(Snapshot(step, DType::kF32, 1));
  EXPECT_EQ(old->hold->charged(), 0);
  EXPECT_THAT(old->hold->Check(), IsOk());
}

constexpr int64_t kRows = 256;
constexpr int64_t kSnapshotBytes = (kRows * kRows + 3) * 4;

SessionConfig BigFirstParam() {
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.params[0].shape = {kRows, kRows};
  return config;
}

// The bytes an engine admits for one BigFirstParam session.
int64_t SessionBytes() {
  auto probe = testutil::MakeEngine(1);
  EXPECT_NE(probe, nullptr);
  EXPECT_NE(testutil::MakeSession(*probe, BigFirstParam()), nullptr);
  return probe->memory_budget().admitted();
}

// Four steps of a BigFirstParam session on `engine`, each step's f32 snapshot pulled and kept.
std::vector<std::shared_ptr<const ParamSnapshot>> PullFourSnapshots(Engine& engine) {
  std::shared_ptr<Session> session = testutil::MakeSession(engine, BigFirstParam());
  EXPECT_NE(session, nullptr);
  std::vector<std::shared_ptr<const ParamSnapshot>> pulled;
  if (session == nullptr) return pulled;
  for (uint64_t step = 1; step <= 4; ++step) {
    const StepHandle c = testutil::BeginStep(*session, step, 0);
    EXPECT_THAT(testutil::SendGradient(*session, c, 0, 0, std::vector<float>(kRows * kRows, 1)),
                IsOk());
    EXPECT_THAT(testutil::SendGradient(*session, c, 1, 0, {1, 2, 3}), IsOk());
    Outcome outcome;
    EXPECT_THAT(session->Commit(c, kRows * kRows + 3, outcome.Callback()), IsOk());
    EXPECT_THAT(outcome.Wait().status(), IsOk());
    absl::Notification got;
    session->GetSnapshot(DType::kF32,
                         [&](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot) {
                           EXPECT_THAT(snapshot.status(), IsOk());
                           if (snapshot.ok()) pulled.push_back(*snapshot);
                           got.Notify();
                         });
    got.WaitForNotification();
  }
  return pulled;
}

// A session whose pulled snapshots a caller keeps while it steps on: the third is charged to the
// rank's budget, the fourth does not fit and is let go.
TEST(SnapshotRetentionTest, ASessionsHeldSnapshotsTakeFromTheEnginesBudget) {
  const int64_t session_bytes = SessionBytes();
  EngineOptions options;
  options.device.num_threads = 1;
  options.memory_budget = session_bytes + kSnapshotBytes * 3 / 2;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(options));
  std::vector<std::shared_ptr<const ParamSnapshot>> pulled = PullFourSnapshots(*engine);
  ASSERT_EQ(pulled.size(), 4u);
  EXPECT_EQ(pulled[0]->hold->charged(), kSnapshotBytes);
  EXPECT_EQ(engine->memory_budget().admitted(), session_bytes + kSnapshotBytes);
  EXPECT_THAT(pulled[1]->hold->Check(), StatusIs(absl::StatusCode::kResourceExhausted,
                                                 "does not fit (a snapshot held for streams"));
  pulled.clear();
  EXPECT_EQ(engine->memory_budget().admitted(), session_bytes);
}

// In a roomy rank, the owner's share (--owner_memory_share) bounds the snapshots its sessions'
// streams hold, beside its sessions' bytes.
TEST(SnapshotRetentionTest, HeldSnapshotsTakeFromTheOwnersShare) {
  const int64_t session_bytes = SessionBytes();
  EngineOptions options;
  options.device.num_threads = 1;
  options.memory_budget = 100 * (session_bytes + kSnapshotBytes);
  options.owner_memory_share = static_cast<double>(session_bytes + kSnapshotBytes * 3 / 2) /
                               static_cast<double>(options.memory_budget);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(options));
  std::vector<std::shared_ptr<const ParamSnapshot>> pulled = PullFourSnapshots(*engine);
  ASSERT_EQ(pulled.size(), 4u);
  EXPECT_EQ(pulled[0]->hold->charged(), kSnapshotBytes);
  EXPECT_THAT(pulled[1]->hold->Check(), StatusIs(absl::StatusCode::kResourceExhausted,
                                                 "a snapshot held for streams of session '"));
  EXPECT_THAT(pulled[1]->hold->Check(),
              StatusIs(absl::StatusCode::kResourceExhausted, "bytes one owner may take"));
  pulled.clear();
  EXPECT_EQ(engine->memory_budget().admitted(), session_bytes);
}

}  // namespace
}  // namespace optstep
