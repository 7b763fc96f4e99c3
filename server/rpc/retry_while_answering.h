#ifndef OPTSTEP_SERVER_RPC_RETRY_WHILE_ANSWERING_H_
#define OPTSTEP_SERVER_RPC_RETRY_WHILE_ANSWERING_H_

// A call to a rank that must not be missed (the end of a heal, a session's close), made again
// while it fails for a passing reason and the rank is alive. Stateless.

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace optstep {

// Makes `attempt` again while it fails for a passing reason (UNAVAILABLE, DEADLINE_EXCEEDED: a
// reset, a call lost on the way), 100 ms and then up to 2 s later, until `give_up`, while the
// callee is alive: `answers()` said so within the last `silence` (one ping that fails, a channel
// reconnecting, is not a lost callee; a heartbeat judges one lost after as long). Each retry is
// logged with `what`. Answers the last attempt's status.
absl::Status RetryWhileAnswering(absl::string_view what, absl::Time give_up, absl::Duration silence,
                                 const std::function<bool()>& answers,
                                 const std::function<absl::Status()>& attempt);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_RETRY_WHILE_ANSWERING_H_
