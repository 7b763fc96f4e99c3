#include "kernels/comm/gloo_status.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>

#include <exception>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/comm/gloo_store.h"

namespace optstep {
namespace internal {

bool IsGlooTimeoutMessage(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  if (absl::StrContains(lower, "caused pair closure")) return false;
  return absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout");
}

absl::Status CallGloo(absl::string_view what, absl::FunctionRef<void()> fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const GlooStoreError& e) {
    return absl::Status(e.status().code(), absl::StrCat(what, ": ", e.status().message()));
  } catch (const gloo::IoException& e) {
    if (IsGlooTimeoutMessage(e.what())) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out: ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat(what, ": peer lost: ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo check failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo error: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": gloo threw an unknown exception"));
  }
}

}  // namespace internal
}  // namespace optstep
