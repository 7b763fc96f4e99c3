#include "client/cpp/grpc_status.h"

#include <grpcpp/support/status.h>

#include "gtest/gtest.h"

namespace optstep {
namespace client_internal {
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

TEST(FromGrpcStatusTest, UnknownCodesBecomeUnknown) {
  const absl::Status status =
      FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(42), "odd"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(status.message(), "odd");
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
