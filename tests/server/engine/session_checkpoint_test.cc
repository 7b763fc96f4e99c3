// Loading a checkpoint into a session (StageCheckpoint) reads each shard once, front to back,
// checking its CRC-32C on the way: the process reads well under twice the shard's bytes (a
// verification pass followed by a read pass took two), the progress counts the shard once, and
// the state applied is the one saved. A shard with a flipped byte is refused with DATA_LOSS
// naming the file and the mismatch, and nothing of it reaches the session.

#include "server/engine/session_checkpoint.h"

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_writer.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::StatusIs;

constexpr char kDefinition[] = "{\"test\": \"session_checkpoint\"}";
constexpr int64_t kRows = 512;

// Bytes this process has read through read(2) and pread(2) so far (Linux /proc/self/io rchar).
uint64_t BytesRead() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

class SessionCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testutil::MakeEngine(/*num_threads=*/1);
    ASSERT_NE(engine_, nullptr);
    SessionConfig config = testutil::TwoParamConfig(testutil::AdamW(0.1, 0.0));
    config.params[0].shape = {kRows, kRows};  // 1 MiB of master, as much of each moment
    s_ = testutil::MakeSession(*engine_, config);
    ASSERT_NE(s_, nullptr);
  }

  // Trainer 0 sends step `step` (gradients varying with the step) and waits for it.
  void Step(uint64_t step) {
    const StepHandle c = testutil::BeginStep(*s_, step, 0);
    std::vector<float> w(kRows * kRows);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * step) % 97) / 97 - 0.5f;
    ASSERT_THAT(testutil::SendGradient(*s_, c, 0, 0, w), IsOk());
    ASSERT_THAT(testutil::SendGradient(*s_, c, 1, 0, {1.0f, 2.0f, 3.0f}), IsOk());
    Outcome outcome;
    ASSERT_THAT(s_->Commit(c, w.size() + 3, outcome.Callback()), IsOk());
    ASSERT_TRUE(outcome.WaitFor(absl::Seconds(30)));
    ASSERT_THAT(outcome.result().status(), IsOk());
  }

  // Holds the session at its current resolution under `token`.
  void Hold(uint64_t token, uint64_t resolutions, HeldPoint* point) {
    ASSERT_THAT(s_->holds().Hold(token, absl::Seconds(30)).status(), IsOk());
    absl::StatusOr<HeldPoint> settled =
        s_->holds().Settle(token, resolutions, absl::Now() + absl::Seconds(10), absl::Seconds(30));
    ASSERT_THAT(settled.status(), IsOk());
    *point = *settled;
  }

  // Every tensor's bytes of the held state, by key.
  std::map<std::string, std::string> Export(uint64_t token) {
    std::map<std::string, std::string> out;
    absl::StatusOr<std::shared_ptr<const StateDict>> dict =
        s_->holds().ExportHeld(token, StateSelection{});
    EXPECT_THAT(dict.status(), IsOk());
    if (!dict.ok()) return out;
    for (const auto& [key, tensor] : **dict) out[key] = tensor.bytes;
    return out;
  }

  testutil::ScopedTempDir root_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Session> s_;
};

TEST_F(SessionCheckpointTest, LoadReadsEachShardOnceAndRefusesACorruptedOne) {
  const CheckpointLocation where{root_.path(), "one"};
  Step(1);
  HeldPoint point;
  Hold(1, 1, &point);
  ASSERT_THAT(PrepareCheckpoint(where.root, where.name, 1), IsOk());
  absl::StatusOr<ShardFile> shard = WriteHeldShard(*s_, 1, where, nullptr);
  ASSERT_THAT(shard.status(), IsOk());
  ASSERT_THAT(CommitSessionCheckpoint(*s_, 1, point, where, kDefinition, {*shard}, 0), IsOk());
  const std::map<std::string, std::string> saved = Export(1);
  ASSERT_THAT(s_->holds().Release(1), IsOk());

  Step(2);
  Hold(2, 2, &point);
  ASSERT_NE(Export(2), saved);
  std::vector<CheckpointProgress> seen;
  const uint64_t read_before = BytesRead();
  absl::StatusOr<uint64_t> step = StageCheckpoint(
      *s_, 2, where, kDefinition, [&](const CheckpointProgress& p) { seen.push_back(p); });
  const uint64_t read = BytesRead() - read_before;
  ASSERT_THAT(step.status(), IsOk());
  EXPECT_EQ(*step, 1u);
  EXPECT_GE(read, shard->bytes);
  EXPECT_LT(read, shard->bytes + shard->bytes / 4) << "shard of " << shard->bytes << " bytes";
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, shard->bytes);
  EXPECT_EQ(seen.back().bytes_total, shard->bytes);
  EXPECT_EQ(seen.back().files_done, 1);
  ASSERT_THAT(s_->holds().ApplyStaged(2), IsOk());
  EXPECT_EQ(Export(2), saved);
  ASSERT_THAT(s_->holds().Release(2), IsOk());

  // One flipped byte in the last tensor's data.
  Hold(3, 2, &point);
  const std::map<std::string, std::string> before = Export(3);
  const std::string file = absl::StrCat(where.root, "/", where.name, "/", shard->file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(static_cast<char>(c ^ 0x04));
  }
  EXPECT_THAT(
      StageCheckpoint(*s_, 3, where, kDefinition, nullptr).status(),
      StatusIs(absl::StatusCode::kDataLoss, absl::StrCat("shard '", file, "': CRC-32C mismatch")));
  EXPECT_THAT(s_->holds().ApplyStaged(3), StatusIs(absl::StatusCode::kFailedPrecondition, ""));
  EXPECT_EQ(Export(3), before);
  ASSERT_THAT(s_->holds().Release(3), IsOk());
}

}  // namespace
}  // namespace optstep
