#include "tests/testing/status_matchers.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::Not;

TEST(StatusMatchersTest, IsOkMatchesOnlyOk) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(absl::StatusOr<int>(3), IsOk());
  EXPECT_THAT(absl::InternalError("x"), Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(absl::NotFoundError("x")), Not(IsOk()));
}

TEST(StatusMatchersTest, StatusIsChecksCodeAndSubstring) {
  absl::Status s = absl::InvalidArgumentError("range [4, 8) exceeds tensor of 4 elements");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, "exceeds tensor"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kInternal, "exceeds tensor")));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kInvalidArgument, "no such text")));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kOutOfRange)));
  EXPECT_THAT(absl::StatusOr<std::string>(s),
              StatusIs(absl::StatusCode::kInvalidArgument, "[4, 8)"));
  EXPECT_THAT(absl::StatusOr<int>(1), StatusIs(absl::StatusCode::kOk));
}

TEST(StatusMatchersTest, FailureMessageShowsTheStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(absl::NotFoundError("param 'w'"), IsOk()),
                          "NOT_FOUND: param 'w'");
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  if (!ok) return absl::ResourceExhaustedError("no memory");
  return std::make_unique<int>(7);
}

TEST(StatusMatchersTest, AssertOkAndAssignMovesTheValue) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<int> value, MakeInt(true));
  EXPECT_EQ(*value, 7);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(value, MakeInt(true));
  EXPECT_EQ(*value, 7);
}

void AssignFailing() {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<int> value, MakeInt(false));
  (void)value;
}

TEST(StatusMatchersTest, AssertOkAndAssignFailsOnError) {
  EXPECT_FATAL_FAILURE(AssignFailing(), "RESOURCE_EXHAUSTED: no memory");
}

}  // namespace
}  // namespace optstep
