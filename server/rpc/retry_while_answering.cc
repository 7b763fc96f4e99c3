#include "server/rpc/retry_while_answering.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace optstep {

absl::Status RetryWhileAnswering(absl::string_view what, absl::Time give_up, absl::Duration silence,
                                 const std::function<bool()>& answers,
                                 const std::function<absl::Status()>& attempt) {
  absl::Duration delay = absl::Milliseconds(100);
  absl::Time answered = absl::Now();
  for (int attempts = 1;; ++attempts) {
    const absl::Status status = attempt();
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kDeadlineExceeded) {
      return status;
    }
    if (absl::Now() + delay > give_up) return status;
    if (answers()) {
      answered = absl::Now();
    } else if (absl::Now() - answered >= silence) {
      return status;
    }
    LOG(WARNING) << "event=peer_call_retry " << what << " attempt=" << attempts << " error=\""
                 << status.message() << "\"";
    absl::SleepFor(delay);
    delay = std::min(2 * delay, absl::Seconds(2));
  }
}

}  // namespace optstep
