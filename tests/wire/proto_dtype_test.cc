#include "wire/proto_dtype.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

TEST(ProtoDTypeTest, EveryDTypeRoundTrips) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(*DTypeFromProto(DTypeToProto(d), "x"), d);
  }
  EXPECT_EQ(DTypeToProto(DType::kF16), v1::DTYPE_FP16);
  EXPECT_EQ(*DTypeFromProto(v1::DTYPE_BF16, "x"), DType::kBF16);
}

TEST(ProtoDTypeTest, RefusesWhatIsNotATensorDType) {
  EXPECT_THAT(DTypeFromProto(v1::DTYPE_UNSPECIFIED, "chunk of param 3").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "chunk of param 3: dtype 0 is not one of fp32, bf16, fp16"));
  // INT64 is a state-dict type only.
  EXPECT_THAT(DTypeFromProto(v1::DTYPE_INT64, "x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "x: dtype"));
  EXPECT_THAT(DTypeFromProto(static_cast<v1::DType>(99), "x").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "x: dtype 99"));
}

}  // namespace
}  // namespace optstep
