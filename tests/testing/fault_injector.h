#ifndef OPTSTEP_TESTS_TESTING_FAULT_INJECTOR_H_
#define OPTSTEP_TESTS_TESTING_FAULT_INJECTOR_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstep {
namespace testutil {

// The faults of one fault-injecting wrapper (FaultInjectingDevice, FaultInjectingCommunicator),
// by method name, in the spirit of LevelDB's ErrorEnv: fail the n-th call of a method with a given
// status, delay its calls, or corrupt its output. Calls are counted per method from 1 since the
// injector was made, whether they were forwarded or failed.
//
//   faults.FailCall("AdamW", faults.calls("AdamW") + 1, absl::InternalError("lost the device"));
//
// A method name the wrapper does not have (or, for CorruptCall, a method without an output) is a
// programming error of the test: the process aborts naming it, so that a misspelt fault cannot
// pass for a test of a failure branch.
//
// Thread-safe: faults may be set while other threads call through the wrapper.
class FaultInjector {
 public:
  // `methods`: every method the wrapper counts; `corruptible`: those with an output it can corrupt.
  FaultInjector(std::vector<std::string> methods, std::vector<std::string> corruptible);

  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  static constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

  // Calls n .. last (1-based, inclusive) of `method` answer `status` without being forwarded.
  // REQUIRES: !status.ok(), 1 <= n <= last.
  void FailCalls(absl::string_view method, int64_t n, int64_t last, absl::Status status);
  // Exactly the n-th call.
  void FailCall(absl::string_view method, int64_t n, absl::Status status) {
    FailCalls(method, n, n, std::move(status));
  }
  // The n-th call of `method` is forwarded, and then answers `status` whatever it did: a failure
  // this side alone sees, its peers having seen the call complete (a collective whose part went
  // out before this rank's connection broke). Only wrappers that pass OnCall an `after` have it.
  // REQUIRES: !status.ok().
  void FailAfterCall(absl::string_view method, int64_t n, absl::Status status);
  // Calls n .. last of `method` sleep for `delay` before they go on (to a failure, or forwarded).
  void DelayCalls(absl::string_view method, int64_t n, int64_t last, absl::Duration delay);
  // The n-th call of `method` is forwarded and, when it succeeds, its output is corrupted (what
  // that means is the wrapper's: a NaN or flipped bits in the first element).
  void CorruptCall(absl::string_view method, int64_t n);
  // Forgets every fault (not the counters).
  void Clear();

  // Calls of `method` so far.
  int64_t calls(absl::string_view method) const;

  // For the wrappers: counts a call of `method` and sleeps for its delays. Answers the status
  // the call must fail with (OK: forward it), in *corrupt whether its output is corrupted and, in
  // *after (when given), the status to answer once it was forwarded (FailAfterCall).
  absl::Status OnCall(absl::string_view method, bool* corrupt, absl::Status* after = nullptr);

 private:
  enum class Kind { kFail, kFailAfter, kDelay, kCorrupt };
  struct Fault {
    Kind kind;
    int64_t first;
    int64_t last;
    absl::Status status;
    absl::Duration delay;
  };
  void Add(absl::string_view method, Fault fault);
  void CheckMethod(absl::string_view method, const std::set<std::string, std::less<>>& known,
                   const char* what) const;

  const std::set<std::string, std::less<>> methods_;
  const std::set<std::string, std::less<>> corruptible_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t, std::less<>> calls_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, Fault, std::less<>> faults_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_FAULT_INJECTOR_H_
