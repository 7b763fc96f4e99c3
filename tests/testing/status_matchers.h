#ifndef OPTSTEP_TESTS_TESTING_STATUS_MATCHERS_H_
#define OPTSTEP_TESTS_TESTING_STATUS_MATCHERS_H_

// gMock matchers for absl::Status and absl::StatusOr<T> (Abseil 20220623 ships none):
//
//   EXPECT_THAT(device.Zero(t), IsOk());
//   EXPECT_THAT(device.Allocate(dtype, {-1}),
//               StatusIs(absl::StatusCode::kInvalidArgument, "negative dimension"));
//   OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device.Allocate(DType::kF32, {4}));
//
// StatusIs(code, substr) matches when the code is `code` and the message contains `substr`
// (an empty `substr` matches any message). Test-only; stateless.

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/status_macros.h"

namespace optstep {
namespace testutil {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status& status = internal::GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, substr,
           std::string(negation ? "does not have" : "has") + " code " +
               absl::StatusCodeToString(code) + " and a message containing \"" +
               std::string(substr) + "\"") {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code && absl::StrContains(status.message(), substr);
}

MATCHER_P(StatusIs, code,
          std::string(negation ? "does not have" : "has") + " code " +
              absl::StatusCodeToString(code)) {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code;
}

}  // namespace testutil
}  // namespace optstep

#define OPTSTEP_ASSERT_OK(expr) ASSERT_THAT((expr), ::optstep::testutil::IsOk())
#define OPTSTEP_EXPECT_OK(expr) EXPECT_THAT((expr), ::optstep::testutil::IsOk())

// Declares or assigns `lhs` from the value of `rexpr` (an absl::StatusOr<T>); fails the test
// (ASSERT: returns from the test function) with the status when it is not OK.
#define OPTSTEP_ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                                 \
  OPTSTEP_ASSERT_OK_AND_ASSIGN_IMPL_(OPTSTEP_STATUS_CONCAT_(optstep_assert_statusor_, __LINE__), \
                                     lhs, rexpr)

#define OPTSTEP_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                       \
  ASSERT_TRUE(statusor.ok()) << statusor.status();               \
  lhs = std::move(statusor).value()

#endif  // OPTSTEP_TESTS_TESTING_STATUS_MATCHERS_H_
