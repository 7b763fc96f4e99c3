#ifndef OPTSTEP_KERNELS_COMM_GLOO_STATUS_H_
#define OPTSTEP_KERNELS_COMM_GLOO_STATUS_H_

// Translates Gloo's error domain (exceptions) into absl::Status at the call site. Internal to
// GlooCommunicator: nothing that Gloo throws leaves kernels/comm.
//
//   absl::Status status = internal::CallGloo("rank 1 of 3: all-reduce", [&] {
//     gloo::allreduce(options);
//   });
//
// Codes:
//   GlooStoreError (the rendezvous store failed)   its own status, message prefixed
//   gloo::IoException that reports a timeout       DEADLINE_EXCEEDED
//   other gloo::IoException (peer closed, reset)   UNAVAILABLE
//   gloo::EnforceNotMet, other exceptions          INTERNAL (arguments were validated before)

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace optstep {
namespace internal {

// Runs `fn`, answering OK or the status of what it threw. `what` prefixes the message.
absl::Status CallGloo(absl::string_view what, absl::FunctionRef<void()> fn);

// Whether the message of a gloo::IoException reports a timeout of the operation itself
// ("Timed out waiting 100ms for recv operation to complete", "Connect timeout ..."), as opposed
// to a connection that Gloo closed because some earlier operation timed out.
bool IsGlooTimeoutMessage(absl::string_view message);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_GLOO_STATUS_H_
