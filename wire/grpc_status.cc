#include "wire/grpc_status.h"

#include <string>

namespace optstep {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    message.resize(kMaxStatusMessageBytes);
    message += "... (truncated)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

}  // namespace optstep
