#include "base/status_payload.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace optstep {

bool IsWirePayload(absl::string_view type_url) { return type_url == kExpectedStepPayload; }

absl::Status WithPayloadNumber(absl::Status status, absl::string_view type_url, uint64_t number) {
  status.SetPayload(type_url, absl::Cord(absl::StrCat(number)));
  return status;
}

std::optional<uint64_t> PayloadNumber(const absl::Status& status, absl::StatusCode code,
                                      absl::string_view type_url) {
  if (status.code() != code) return std::nullopt;
  const auto payload = status.GetPayload(type_url);
  uint64_t number = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &number)) return std::nullopt;
  return number;
}

}  // namespace optstep
