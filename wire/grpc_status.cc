#include "wire/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "base/status_payload.h"
#include "proto/optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace {

bool IsPublic(absl::string_view type_url) {
  return absl::StartsWith(type_url, kPublicPayloadPrefix);
}

// The status details carrying `status`'s public payloads; empty when it has none.
std::string PublicDetails(const absl::Status& status, const std::string& message) {
  v1::StatusDetails details;
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& value) {
    if (!IsPublic(type_url) || value.size() > kMaxPayloadBytes ||
        static_cast<size_t>(details.payloads_size()) >= kMaxPublicPayloads) {
      return;
    }
    v1::StatusPayload* payload = details.add_payloads();
    payload->set_type_url(std::string(type_url));
    payload->set_value(std::string(value));
  });
  if (details.payloads_size() == 0) return "";
  details.set_code(static_cast<int>(status.code()));
  details.set_message(message);
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
  return grpc::Status(code, message, PublicDetails(status, message));
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
  size_t kept = 0;
  for (const v1::StatusPayload& payload : details.payloads()) {
    if (kept == kMaxPublicPayloads) break;
    if (!IsPublic(payload.type_url()) || payload.value().size() > kMaxPayloadBytes) continue;
    converted.SetPayload(payload.type_url(), absl::Cord(payload.value()));
    ++kept;
  }
  return converted;
}

}  // namespace optstep
