#include "tests/testing/fault_injector.h"

#include <utility>

#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace optstep {
namespace testutil {

FaultInjector::FaultInjector(std::vector<std::string> methods, std::vector<std::string> corruptible)
    : methods_(methods.begin(), methods.end()),
      corruptible_(corruptible.begin(), corruptible.end()) {
  for (const std::string& method : corruptible_) CheckMethod(method, methods_, "counted");
}

void FaultInjector::CheckMethod(absl::string_view method,
                                const std::set<std::string, std::less<>>& known,
                                const char* what) const {
  CHECK(known.count(method) > 0) << "no " << what << " method '" << method
                                 << "'; there are: " << absl::StrJoin(known, ", ");
}

void FaultInjector::Add(absl::string_view method, Fault fault) {
  CheckMethod(method, fault.kind == Kind::kCorrupt ? corruptible_ : methods_,
              fault.kind == Kind::kCorrupt ? "corruptible" : "counted");
  CHECK(1 <= fault.first && fault.first <= fault.last)
      << "calls " << fault.first << " .. " << fault.last << " of '" << method << "'";
  absl::MutexLock lock(&mu_);
  faults_.emplace(std::string(method), std::move(fault));
}

void FaultInjector::FailCalls(absl::string_view method, int64_t n, int64_t last,
                              absl::Status status) {
  CHECK(!status.ok()) << "a failure of '" << method << "' needs an error status";
  Add(method, Fault{Kind::kFail, n, last, std::move(status), absl::ZeroDuration()});
}

void FaultInjector::FailAfterCall(absl::string_view method, int64_t n, absl::Status status) {
  CHECK(!status.ok()) << "a failure of '" << method << "' needs an error status";
  Add(method, Fault{Kind::kFailAfter, n, n, std::move(status), absl::ZeroDuration()});
}

void FaultInjector::DelayCalls(absl::string_view method, int64_t n, int64_t last,
                               absl::Duration delay) {
  Add(method, Fault{Kind::kDelay, n, last, absl::OkStatus(), delay});
}

void FaultInjector::CorruptCall(absl::string_view method, int64_t n) {
  Add(method, Fault{Kind::kCorrupt, n, n, absl::OkStatus(), absl::ZeroDuration()});
}

void FaultInjector::Clear() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
}

int64_t FaultInjector::calls(absl::string_view method) const {
  CheckMethod(method, methods_, "counted");
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

absl::Status FaultInjector::OnCall(absl::string_view method, bool* corrupt, absl::Status* after) {
  absl::Status status;
  absl::Duration delay;
  *corrupt = false;
  if (after != nullptr) *after = absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    auto count = calls_.find(method);
    if (count == calls_.end()) count = calls_.emplace(std::string(method), 0).first;
    const int64_t call = ++count->second;
    auto [begin, end] = faults_.equal_range(method);
    for (auto it = begin; it != end; ++it) {
      const Fault& fault = it->second;
      if (call < fault.first || call > fault.last) continue;
      switch (fault.kind) {
        case Kind::kFail:
          if (status.ok()) status = fault.status;
          break;
        case Kind::kFailAfter:
          CHECK(after != nullptr) << "'" << method << "' cannot fail after it was forwarded";
          if (after->ok()) *after = fault.status;
          break;
        case Kind::kDelay:
          delay += fault.delay;
          break;
        case Kind::kCorrupt:
          *corrupt = true;
          break;
      }
    }
  }
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
  return status;
}

}  // namespace testutil
}  // namespace optstep
