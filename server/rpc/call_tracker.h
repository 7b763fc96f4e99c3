#ifndef OPTSTEP_SERVER_RPC_CALL_TRACKER_H_
#define OPTSTEP_SERVER_RPC_CALL_TRACKER_H_

// A server interceptor that sees every call of the server: it counts the
// streaming calls in progress (the active-streams gauge, and the Step streams a
// shutdown waits for), and counts and logs every call that ends with an error
// status.

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/rpc/metrics.h"

namespace optstep {

// Thread-safe.
class CallTracker {
 public:
  // `metrics` may be null; it must outlive the tracker.
  explicit CallTracker(ServerMetrics *metrics) : metrics_(metrics) {}

  // A factory for ServerBuilder::experimental().SetInterceptorCreators; it
  // refers to this tracker, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeFactory();

  // Waits until no Step stream is in progress, or `deadline`; false on the
  // deadline.
  bool AwaitNoSteps(absl::Time deadline);
  int active_steps() const;

  // Called by the interceptor.
  void CallStarted(bool streaming, bool step);
  void CallEnded(bool streaming, bool step);
  void CallFailed(const char *method, const grpc::Status &status);

 private:
  ServerMetrics *const metrics_;
  mutable absl::Mutex mu_;
  int active_steps_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CALL_TRACKER_H_
