#include "wire/grpc_status.h"

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "base/status_payload.h"
#include "gtest/gtest.h"
#include "proto/optstep/v1/optimizer_service.pb.h"

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

// The step a refusal expects crosses gRPC, as the clients read it; payloads of the process (no
// public type URL) do not.
TEST(GrpcStatusTest, PublicPayloadsCrossAndOthersStay) {
  absl::Status refused = WithPayloadNumber(absl::FailedPreconditionError("step 5 out of sequence"),
                                           kExpectedStepPayload, 6);
  refused.SetPayload("type.internal/x", absl::Cord("secret"));
  const grpc::Status sent = ToGrpcStatus(refused);
  v1::StatusDetails details;
  ASSERT_TRUE(details.ParseFromString(sent.error_details()));
  ASSERT_EQ(details.payloads_size(), 1);
  EXPECT_EQ(details.payloads(0).type_url(), kExpectedStepPayload);
  EXPECT_EQ(details.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));

  const absl::Status received = FromGrpcStatus(sent);
  EXPECT_EQ(received.message(), "step 5 out of sequence");
  EXPECT_EQ(PayloadNumber(received, absl::StatusCode::kFailedPrecondition, kExpectedStepPayload),
            std::optional<uint64_t>(6));
  EXPECT_FALSE(received.GetPayload("type.internal/x").has_value());
  EXPECT_EQ(PayloadNumber(received, absl::StatusCode::kAborted, kExpectedStepPayload),
            std::nullopt);
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("no payload")).error_details().empty());
}

// Details from a peer are checked: garbage is ignored, and so are payloads a server does not
// send (a rewind, which only the client's own recovery may tell) and oversized ones.
TEST(GrpcStatusTest, DetailsFromAPeerCarryOnlyWhatAServerSends) {
  EXPECT_EQ(
      FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "m", "\xff\xff garbage")).message(),
      "m");
  v1::StatusDetails details;
  v1::StatusPayload* rewind = details.add_payloads();
  rewind->set_type_url("type.optstep.dev/optstep.RewindStep");
  rewind->set_value("2");
  v1::StatusPayload* oversized = details.add_payloads();
  oversized->set_type_url(std::string(kExpectedStepPayload));
  oversized->set_value(std::string(kMaxPayloadBytes + 1, '1'));
  const absl::Status received =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "m", details.SerializeAsString()));
  int kept = 0;
  received.ForEachPayload([&kept](absl::string_view, const absl::Cord&) { ++kept; });
  EXPECT_EQ(kept, 0);
}

}  // namespace
}  // namespace optstep
