#include "wire/chunk.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(CheckChunkExtentTest, TheLimitsThemselvesPass) {
  EXPECT_THAT(CheckChunkExtent(0, 0, "x"), IsOk());
  EXPECT_THAT(CheckChunkExtent(kMaxChunkOffset, kMaxChunkBytes, "x"), IsOk());
}

TEST(CheckChunkExtentTest, ABiggerChunkIsResourceExhausted) {
  EXPECT_THAT(CheckChunkExtent(0, kMaxChunkBytes + 1, "gradient chunk of param_id 3"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "gradient chunk of param_id 3: 4194305 bytes exceeds the 4194304-byte "
                       "chunk limit"));
}

TEST(CheckChunkExtentTest, AnOffsetPastTheLimitIsRefusedNotClamped) {
  EXPECT_THAT(CheckChunkExtent(kMaxChunkOffset + 1, 4, "values of param_id 0"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "values of param_id 0: offset 4611686018427387905 out of range"));
  EXPECT_THAT(CheckChunkExtent(~uint64_t{0}, 4, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
}

TEST(CheckChunkHeaderTest, ConvertsAValidHeader) {
  absl::StatusOr<ChunkHeader> header = CheckChunkHeader(7, 12, v1::DTYPE_BF16, 16, "x");
  ASSERT_THAT(header.status(), IsOk());
  EXPECT_EQ(header->param_id, 7);
  EXPECT_EQ(header->offset, 12);
  EXPECT_EQ(header->dtype, DType::kBF16);
}

TEST(CheckChunkHeaderTest, AHugeParamIdStaysPositiveAndNamesNoParameter) {
  absl::StatusOr<ChunkHeader> header = CheckChunkHeader(~uint32_t{0}, 0, v1::DTYPE_FP32, 4, "x");
  ASSERT_THAT(header.status(), IsOk());
  EXPECT_EQ(header->param_id, 1 << 30);
}

TEST(CheckChunkHeaderTest, RefusesEachBadFieldAndTheSizeFirst) {
  EXPECT_THAT(CheckChunkHeader(0, 0, v1::DTYPE_UNSPECIFIED, kMaxChunkBytes + 1, "x").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "chunk limit"));
  EXPECT_THAT(
      CheckChunkHeader(1, 0, v1::DTYPE_UNSPECIFIED, 4, "gradient chunk of param_id 1").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "gradient chunk of param_id 1: dtype 0"));
  EXPECT_THAT(CheckChunkHeader(1, kMaxChunkOffset + 1, v1::DTYPE_FP32, 4, "x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "x: offset"));
}

}  // namespace
}  // namespace optstep
