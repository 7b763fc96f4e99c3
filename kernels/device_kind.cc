#include "kernels/device_kind.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace internal {
namespace {

// 1 to 6 decimal digits, nothing else (SimpleAtoi alone would accept signs and spaces).
bool IsOrdinal(absl::string_view s) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view kind) {
  DeviceKind parsed;
  if (kind == "cpu") {
    parsed.type = DeviceKind::kCpu;
  } else if (kind == "auto") {
    parsed.type = DeviceKind::kAuto;
  } else if (kind == "cuda") {
    parsed.type = DeviceKind::kCuda;
  } else if (absl::StartsWith(kind, "cuda:") && IsOrdinal(kind.substr(5)) &&
             absl::SimpleAtoi(kind.substr(5), &parsed.ordinal)) {
    parsed.type = DeviceKind::kCuda;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown device kind '", kind, "'; expected 'cpu', 'cuda', 'cuda:N' or 'auto'"));
  }
  return parsed;
}

}  // namespace internal
}  // namespace optstep
