#include "server/rpc/retry_while_answering.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "base/caller_text.h"
#include "glog/logging.h"

namespace optstep {

absl::Status RetryWhileAnswering(absl::string_view what, absl::Time give_up, absl::Duration silence,
                                 const std::function<bool()>& answers,
                                 const std::function<absl::Status()>& attempt) {
  absl::Duration delay = absl::Milliseconds(100);
  // How long the callee has not answered, counted in the waits between its pings (not in the
  // attempts, which may block for a while themselves).
  absl::Duration silent = absl::ZeroDuration();
  for (int attempts = 1;; ++attempts) {
    const absl::Status status = attempt();
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kDeadlineExceeded) {
      return status;
    }
    if (absl::Now() + delay > give_up) return status;
    const bool answered = answers();
    if (answered) {
      silent = absl::ZeroDuration();
    } else if (silent >= silence) {
      return status;
    }
    LOG(WARNING) << "event=peer_call_retry " << what << " attempt=" << attempts << " error=\""
                 << LogValue(status.message()) << "\"";
    absl::SleepFor(delay);
    if (!answered) silent += delay;
    delay = std::min(2 * delay, absl::Seconds(2));
  }
}

}  // namespace optstep
