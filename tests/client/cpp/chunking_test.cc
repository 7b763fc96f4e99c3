#include "client/cpp/chunking.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "client/cpp/client_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// Two ranks: "a" (10 elements) and "c" (3) on rank 0, "b" (7) on rank 1.
SessionLayout TwoRankLayout() {
  return SessionLayout("s", 2, {{"a", 10, 0}, {"b", 7, 1}, {"c", 3, 0}});
}

std::vector<uint8_t> Bytes(size_t n) {
  std::vector<uint8_t> bytes(n);
  std::iota(bytes.begin(), bytes.end(), 0);
  return bytes;
}

GradientSlice Slice(uint32_t id, uint64_t offset, DType dtype, const std::vector<uint8_t>& bytes) {
  GradientSlice slice;
  slice.param_id = id;
  slice.offset = offset;
  slice.dtype = dtype;
  slice.bytes = bytes;
  return slice;
}

TEST(SplitIntoChunksTest, SplitsAtWholeElementsAndKeepsOrder) {
  const std::vector<uint8_t> bytes = Bytes(10 * 4);
  // 12 bytes per chunk = 3 fp32 elements: 3 + 3 + 3 + 1.
  std::vector<GradientSlice> chunks =
      SplitIntoChunks({Slice(0, 0, DType::kF32, bytes)}, /*max_chunk_bytes=*/13);
  ASSERT_EQ(chunks.size(), 4u);
  uint64_t next = 0;
  for (const GradientSlice& c : chunks) {
    EXPECT_EQ(c.param_id, 0u);
    EXPECT_EQ(c.offset, next);
    EXPECT_EQ(c.bytes.data(), bytes.data() + next * 4);  // views, no copies
    next += c.bytes.size() / 4;
  }
  EXPECT_EQ(next, 10u);
  EXPECT_EQ(chunks.back().bytes.size(), 4u);
}

TEST(SplitIntoChunksTest, OffsetsAreElementsOfTheSlicesDtype) {
  const std::vector<uint8_t> bytes = Bytes(5 * 2);
  std::vector<GradientSlice> chunks =
      SplitIntoChunks({Slice(1, 2, DType::kBF16, bytes)}, /*max_chunk_bytes=*/4);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].offset, 2u);
  EXPECT_EQ(chunks[1].offset, 4u);
  EXPECT_EQ(chunks[2].offset, 6u);
  EXPECT_EQ(chunks[2].bytes.size(), 2u);
  EXPECT_EQ(chunks[1].dtype, DType::kBF16);
}

TEST(SplitIntoChunksTest, ExactMultipleAndEmptySlices) {
  const std::vector<uint8_t> bytes = Bytes(8 * 4);
  const std::vector<uint8_t> empty;
  std::vector<GradientSlice> chunks = SplitIntoChunks(
      {Slice(0, 0, DType::kF32, empty), Slice(0, 0, DType::kF32, bytes)}, 16);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].bytes.size(), 16u);
  EXPECT_EQ(chunks[1].bytes.size(), 16u);
  EXPECT_EQ(chunks[1].offset, 4u);
}

TEST(SplitIntoChunksTest, DefaultChunkSizeIsFourMiB) {
  const std::vector<uint8_t> bytes((4 << 20) + 8);
  std::vector<GradientSlice> chunks =
      SplitIntoChunks({Slice(0, 0, DType::kF32, bytes)}, ClientOptions().max_chunk_bytes);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].bytes.size(), 4u << 20);
  EXPECT_EQ(chunks[1].offset, (4u << 20) / 4);
  EXPECT_EQ(chunks[1].bytes.size(), 8u);
}

TEST(ValidateSliceTest, AcceptsRangesInsideTheParameter) {
  const SessionLayout layout = TwoRankLayout();
  EXPECT_THAT(ValidateSlice(layout, Slice(0, 0, DType::kF32, Bytes(40))), IsOk());
  EXPECT_THAT(ValidateSlice(layout, Slice(0, 9, DType::kF16, Bytes(2))), IsOk());
  EXPECT_THAT(ValidateSlice(layout, Slice(0, 10, DType::kF32, Bytes(0))), IsOk());
}

TEST(ValidateSliceTest, RejectsBadSlicesNamingTheParameter) {
  const SessionLayout layout = TwoRankLayout();
  EXPECT_THAT(ValidateSlice(layout, Slice(3, 0, DType::kF32, Bytes(4))),
              StatusIs(absl::StatusCode::kNotFound, "param_id 3 not found"));
  EXPECT_THAT(ValidateSlice(layout, Slice(1, 0, DType::kBF16, Bytes(3))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'b': 3 bytes is not a multiple of the bf16 element size 2"));
  EXPECT_THAT(ValidateSlice(layout, Slice(0, 8, DType::kF32, Bytes(12))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'a': gradient [8, 11) exceeds 10 elements"));
  EXPECT_THAT(ValidateSlice(layout, Slice(0, 11, DType::kF32, Bytes(0))),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds 10 elements"));
  // An offset so large that offset + count would wrap around.
  EXPECT_THAT(ValidateSlice(layout, Slice(0, ~uint64_t{0}, DType::kF32, Bytes(4))),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'a'"));
}

TEST(FullGradientsToSlicesTest, ViewsWholeTensors) {
  const SessionLayout layout = TwoRankLayout();
  std::vector<float> b(7, 1.5f);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<GradientSlice> slices,
                               FullGradientsToSlices(layout, {FullGradient{1, b}}));
  ASSERT_EQ(slices.size(), 1u);
  EXPECT_EQ(slices[0].param_id, 1u);
  EXPECT_EQ(slices[0].offset, 0u);
  EXPECT_EQ(slices[0].dtype, DType::kF32);
  EXPECT_EQ(slices[0].bytes.size(), 28u);
  EXPECT_EQ(static_cast<const void*>(slices[0].bytes.data()), static_cast<const void*>(b.data()));
}

TEST(FullGradientsToSlicesTest, RejectsWrongSizesAndIds) {
  const SessionLayout layout = TwoRankLayout();
  std::vector<float> six(6);
  EXPECT_THAT(FullGradientsToSlices(layout, {FullGradient{1, six}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'b': full gradient has 6 elements, expected 7"));
  EXPECT_THAT(FullGradientsToSlices(layout, {FullGradient{9, six}}),
              StatusIs(absl::StatusCode::kNotFound, "param_id 9"));
}

TEST(PlanContributionsTest, GroupsChunksByOwnerRank) {
  const SessionLayout layout = TwoRankLayout();
  const std::vector<uint8_t> a = Bytes(10 * 4), b = Bytes(7 * 2), c = Bytes(3 * 4);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      std::vector<RankContribution> plan,
      PlanContributions(layout,
                        {Slice(0, 0, DType::kF32, a), Slice(1, 0, DType::kBF16, b),
                         Slice(2, 0, DType::kF32, c)},
                        /*max_chunk_bytes=*/16));
  ASSERT_EQ(plan.size(), 2u);
  // Rank 0: a in 4+4+2 elements, then c in 3.
  ASSERT_EQ(plan[0].chunks.size(), 4u);
  EXPECT_EQ(plan[0].num_elements, 13u);
  EXPECT_EQ(plan[0].chunks[0].param_id, 0u);
  EXPECT_EQ(plan[0].chunks[2].offset, 8u);
  EXPECT_EQ(plan[0].chunks[3].param_id, 2u);
  // Rank 1: b (bf16) in 8 + ... elements of 2 bytes: 16 bytes = 8 elements > 7, one chunk.
  ASSERT_EQ(plan[1].chunks.size(), 1u);
  EXPECT_EQ(plan[1].num_elements, 7u);
  EXPECT_EQ(plan[1].chunks[0].param_id, 1u);
}

TEST(PlanContributionsTest, RanksWithoutGradientsGetAnEmptyContribution) {
  const SessionLayout layout = TwoRankLayout();
  const std::vector<uint8_t> b = Bytes(7 * 4);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<RankContribution> plan,
                               PlanContributions(layout, {Slice(1, 0, DType::kF32, b)}, 1024));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_TRUE(plan[0].chunks.empty());
  EXPECT_EQ(plan[0].num_elements, 0u);
  EXPECT_EQ(plan[1].num_elements, 7u);
}

TEST(PlanContributionsTest, ValidatesEverySliceBeforePlanning) {
  const SessionLayout layout = TwoRankLayout();
  const std::vector<uint8_t> ok = Bytes(4), bad = Bytes(8 * 4);
  EXPECT_THAT(PlanContributions(layout,
                                {Slice(0, 0, DType::kF32, ok), Slice(1, 0, DType::kF32, bad)},
                                1024),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b': gradient [0, 8)"));
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
