#include "server/rpc/call_tracker.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/log_budget.h"
#include "glog/logging.h"

namespace optstep {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

constexpr const char* kStepMethod = "/optstep.v1.OptimizerService/Step";

// One per call; gRPC destroys it when the call is done.
class TrackingInterceptor final : public grpc::experimental::Interceptor {
 public:
  TrackingInterceptor(CallTracker* tracker, ServerRpcInfo* info)
      : tracker_(tracker),
        method_(info->method()),
        streaming_(info->type() != ServerRpcInfo::Type::UNARY),
        step_(std::strcmp(info->method(), kStepMethod) == 0) {
    tracker_->CallStarted(streaming_, step_);
  }
  ~TrackingInterceptor() override { tracker_->CallEnded(streaming_, step_); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (!status.ok()) tracker_->CallFailed(method_, status);
    }
    methods->Proceed();
  }

 private:
  CallTracker* const tracker_;
  const char* const method_;  // owned by gRPC for the server's lifetime
  const bool streaming_;
  const bool step_;
};

class TrackingFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit TrackingFactory(CallTracker* tracker) : tracker_(tracker) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    return new TrackingInterceptor(tracker_, info);
  }

 private:
  CallTracker* const tracker_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallTracker::MakeFactory() {
  return std::make_unique<TrackingFactory>(this);
}

void CallTracker::CallStarted(bool streaming, bool step) {
  if (streaming && metrics_ != nullptr) metrics_->StreamStarted();
  if (!step) return;
  absl::MutexLock lock(&mu_);
  ++active_steps_;
}

void CallTracker::CallEnded(bool streaming, bool step) {
  if (streaming && metrics_ != nullptr) metrics_->StreamEnded();
  if (!step) return;
  absl::MutexLock lock(&mu_);
  --active_steps_;
}

void CallTracker::CallFailed(const char* method, const grpc::Status& status) {
  const std::string code =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  if (metrics_ != nullptr) metrics_->CountRpcError(method, code);
  // Client-side endings (a trainer that went away) are routine; the rest are worth a warning.
  // A Step stream's error is logged by the stream itself, with its session, step and trainer.
  if (status.error_code() == grpc::StatusCode::CANCELLED || std::strcmp(method, kStepMethod) == 0) {
    VLOG(1) << "event=rpc_error method=" << method << " code=" << code;
    return;
  }
  int64_t dropped = 0;  // a caller may fail call after call
  if (!CallerLogBudget().Take(&dropped)) return;
  LOG(WARNING) << "event=rpc_error method=" << method << " code=" << code << " message=\""
               << LogValue(status.error_message()) << "\"" << DroppedBefore(dropped);
}

bool CallTracker::AwaitNoSteps(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(
                                   +[](int* active) { return *active == 0; }, &active_steps_),
                               deadline);
}

int CallTracker::active_steps() const {
  absl::MutexLock lock(&mu_);
  return active_steps_;
}

}  // namespace optstep
