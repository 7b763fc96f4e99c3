// SharedStepIo::WriteParams: a Step stream that names a shared memory segment gets its
// parameters written into the segment, each as soon as the step made it ready, and its result
// only once the step ended on the rank; parameters that are not the segment's, or values that
// are not their fp32 bytes, are INTERNAL; a failed step's error reaches the stream.

#include "server/rpc/shared_step.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/memory_budget.h"
#include "server/engine/shared_segments.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// p0 [4] and p2 [3] on rank 0, p1 [2] on rank 1.
class SharedStepTest : public ::testing::Test {
 protected:
  SharedStepTest() : budget_(1 << 20, 0), segments_(&budget_, 0) {
    const std::vector<ParamInfo> params = {{"p0", {4}}, {"p1", {2}}, {"p2", {3}}};
    absl::StatusOr<std::shared_ptr<const SharedSegment>> segment =
        segments_.Attach("s", 0, params, Layout{2, {0, 1, 0}});
    EXPECT_THAT(segment.status(), IsOk());
    if (segment.ok()) segment_ = *segment;
  }

  // A snapshot of every parameter: value i of parameter p is 10 p + i.
  static ParamSnapshot Snapshot() {
    ParamSnapshot snapshot;
    for (int p : {0, 1, 2}) {
      std::vector<float> values(p == 1 ? 2 : (p == 0 ? 4 : 3));
      for (size_t i = 0; i < values.size(); ++i) values[i] = 10.0f * p + i;
      snapshot.values.emplace_back(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    }
    return snapshot;
  }

  std::vector<float> Written(size_t entry) const {
    std::vector<float> values(segment_->numels[entry]);
    std::memcpy(values.data(), segment_->value(entry), values.size() * 4);
    return values;
  }

  MemoryBudget budget_;
  SharedSegments segments_;
  std::shared_ptr<const SharedSegment> segment_;
};

TEST_F(SharedStepTest, ACompleteSnapshotIsWrittenAtOnce) {
  ASSERT_NE(segment_, nullptr);
  SharedStepIo io(segment_);
  const ParamSnapshot snapshot = Snapshot();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(bool done, io.WriteParams(snapshot, {2, 0}, nullptr));
  EXPECT_TRUE(done);
  EXPECT_EQ(Written(0), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(Written(1), (std::vector<float>{20, 21, 22}));
  EXPECT_EQ(io.bytes_written(), 7 * 4);
}

TEST_F(SharedStepTest, ParametersAreWrittenAsTheyBecomeReadyAndTheResultWaitsForTheStepsEnd) {
  ASSERT_NE(segment_, nullptr);
  SharedStepIo io(segment_);
  ParamSnapshot snapshot = Snapshot();
  snapshot.readiness = std::make_shared<ParamReadiness>();
  int woken = 0;
  const auto wake = [&woken] { ++woken; };
  OPTSTEP_ASSERT_OK_AND_ASSIGN(bool done, io.WriteParams(snapshot, {0, 2}, wake));
  EXPECT_FALSE(done);
  EXPECT_EQ(io.bytes_written(), 0);
  // p1 is gathered from rank 1: not the segment's, skipped.
  snapshot.readiness->MarkReady({2, 1});
  EXPECT_EQ(woken, 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(done, io.WriteParams(snapshot, {0, 2}, wake));
  EXPECT_FALSE(done);
  EXPECT_EQ(Written(1), (std::vector<float>{20, 21, 22}));
  EXPECT_EQ(io.bytes_written(), 3 * 4);
  snapshot.readiness->MarkReady({0});
  OPTSTEP_ASSERT_OK_AND_ASSIGN(done, io.WriteParams(snapshot, {0, 2}, wake));
  EXPECT_FALSE(done) << "every value written, but the step has not ended on the rank";
  EXPECT_EQ(Written(0), (std::vector<float>{0, 1, 2, 3}));
  snapshot.readiness->End();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(done, io.WriteParams(snapshot, {0, 2}, wake));
  EXPECT_TRUE(done);
  EXPECT_EQ(io.bytes_written(), 7 * 4);
}

TEST_F(SharedStepTest, AFailedStepsErrorReachesTheStream) {
  ASSERT_NE(segment_, nullptr);
  SharedStepIo io(segment_);
  ParamSnapshot snapshot = Snapshot();
  snapshot.readiness = std::make_shared<ParamReadiness>();
  ASSERT_THAT(io.WriteParams(snapshot, {0}, nullptr).status(), IsOk());
  snapshot.readiness->Fail(absl::UnavailableError("rank 1 lost"));
  EXPECT_THAT(io.WriteParams(snapshot, {0}, nullptr).status(),
              StatusIs(absl::StatusCode::kUnavailable, "rank 1 lost"));
}

TEST_F(SharedStepTest, AParameterNotInTheSegmentOrAValueOfAnotherSizeIsInternal) {
  ASSERT_NE(segment_, nullptr);
  const ParamSnapshot snapshot = Snapshot();
  SharedStepIo not_ours(segment_);
  EXPECT_THAT(not_ours.WriteParams(snapshot, {1}, nullptr).status(),
              StatusIs(absl::StatusCode::kInternal, "param_id 1 is not in shared_memory_segment"));
  ParamSnapshot bf16 = Snapshot();
  bf16.values[0].resize(8);  // 4 elements of 2 bytes
  SharedStepIo sized(segment_);
  EXPECT_THAT(sized.WriteParams(bf16, {0}, nullptr).status(),
              StatusIs(absl::StatusCode::kInternal, "no fp32 value of param_id 0"));
}

}  // namespace
}  // namespace optstep
