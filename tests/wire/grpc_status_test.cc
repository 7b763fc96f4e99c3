#include "wire/grpc_status.h"

#include <grpcpp/support/status.h>

#include <string>

#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(FromGrpcStatusTest, KeepsEveryCodeAndTheMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status =
        FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), "param 'w': bad"));
    EXPECT_EQ(static_cast<int>(status.code()), code);
    EXPECT_EQ(status.message(), "param 'w': bad");
  }
  const absl::Status aborted =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "step 3 aborted"));
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted);
}

TEST(ToGrpcStatusTest, KeepsTheCodeAndCutsLongMessages) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status short_one = ToGrpcStatus(absl::NotFoundError("session 's1' not found"));
  EXPECT_EQ(short_one.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(short_one.error_message(), "session 's1' not found");
  const grpc::Status long_one =
      ToGrpcStatus(absl::InvalidArgumentError(std::string(kMaxStatusMessageBytes + 1, 'x')));
  EXPECT_EQ(long_one.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(long_one.error_message(), std::string(kMaxStatusMessageBytes, 'x') + "... (truncated)");
  EXPECT_EQ(
      ToGrpcStatus(absl::InternalError(std::string(kMaxStatusMessageBytes, 'y'))).error_message(),
      std::string(kMaxStatusMessageBytes, 'y'));
}

TEST(FromGrpcStatusTest, UnknownCodesBecomeUnknown) {
  // 20 names no code but lies in grpc::StatusCode's range of values (0..31); 42 would not, and
  // loading it is undefined behaviour (UBSan).
  const absl::Status status =
      FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(status.message(), "odd");
}

}  // namespace
}  // namespace optstep
