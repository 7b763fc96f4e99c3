#include "wire/grpc_status.h"

#include <string>

#include "base/status_payload.h"
#include "proto/optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace {

bool Carried(absl::string_view type_url, size_t bytes) {
  return IsWirePayload(type_url) && bytes <= kMaxPayloadBytes;
}

// The status details carrying `status`'s wire payloads; empty when it has none. (The message
// stays in grpc-message alone: the trailers are bounded.)
std::string WireDetails(const absl::Status& status) {
  v1::StatusDetails details;
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& value) {
    if (!Carried(type_url, value.size())) return;
    v1::StatusPayload* payload = details.add_payloads();
    payload->set_type_url(std::string(type_url));
    payload->set_value(std::string(value));
  });
  if (details.payloads_size() == 0) return "";
  details.set_code(static_cast<int>(status.code()));
  return details.SerializeAsString();
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    message.resize(kMaxStatusMessageBytes);
    message += "... (truncated)";
  }
  const auto code = static_cast<grpc::StatusCode>(status.code());
  return grpc::Status(code, message, WireDetails(status));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.error_message());
  }
  absl::Status converted(static_cast<absl::StatusCode>(code), status.error_message());
  v1::StatusDetails details;
  if (status.error_details().empty() || !details.ParseFromString(status.error_details())) {
    return converted;
  }
  for (const v1::StatusPayload& payload : details.payloads()) {
    if (!Carried(payload.type_url(), payload.value().size())) continue;
    converted.SetPayload(payload.type_url(), absl::Cord(payload.value()));
  }
  return converted;
}

}  // namespace optstep
