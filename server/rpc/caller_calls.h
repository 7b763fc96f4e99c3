#ifndef OPTSTEP_SERVER_RPC_CALLER_CALLS_H_
#define OPTSTEP_SERVER_RPC_CALLER_CALLS_H_

// The callers' calls that run on threads of their own (RunDetached): CreateSession, CloseSession,
// ExportStateDict, Save, Load and a complete ImportStateDict. Each blocks its thread (on other ranks, on the session's hold,
// on files), so a caller that made thousands at once, cancelling each, made the rank start a
// thread for each until the process could start no more and died, and every tenant lost the
// rank. Now a caller identity runs a few at once and the rank a bounded number; the rest wait
// their turn in a queue per caller (bounded too), served in turn, so that a burst (the thousands
// of trainers of one job attaching to its session) waits rather than fails, and one caller's
// queue does not hold up another's calls.

#include <cstddef>
#include <deque>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace optstep {

// Thread-safe; must outlive the work it runs (ProcessCallerCalls() does).
class CallerCalls {
 public:
  struct Limits {
    int per_caller = 16;              // calls of one caller running at once
    int total = 256;                  // calls running at once
    size_t queued_per_caller = 8192;  // calls of one caller waiting their turn
    // Request bytes the waiting calls of one caller hold (a CreateSession's spec, up to the
    // message limit, is held until its call ran).
    int64_t queued_bytes_per_caller = int64_t{64} << 20;
  };
  explicit CallerCalls(Limits limits) : limits_(limits) {}
  CallerCalls(const CallerCalls&) = delete;
  CallerCalls& operator=(const CallerCalls&) = delete;

  // Runs `work` on a thread of its own now, or once the limits let it (the callers' queued calls
  // in turn); RESOURCE_EXHAUSTED naming `what` and the limit when `caller` has as many queued as
  // it may, or has calls waiting whose requests would hold more than queued_bytes_per_caller
  // with the `bytes` this one holds: `work` then never runs.
  absl::Status Run(const std::string& caller, const std::string& what, std::function<void()> work,
                   int64_t bytes = 0) ABSL_LOCKS_EXCLUDED(mu_);
  int running() const ABSL_LOCKS_EXCLUDED(mu_);
  int queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    std::function<void()> work;
    int64_t bytes = 0;
  };
  struct Queue {
    int running = 0;
    std::deque<Waiting> waiting;
    int64_t waiting_bytes = 0;
  };
  // Takes the next call that may run now, the callers in turn; none when none may.
  std::function<void()> NextLocked(std::string* caller) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Start(std::string caller, std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);
  void Done(const std::string& caller) ABSL_LOCKS_EXCLUDED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Queue> queues_ ABSL_GUARDED_BY(mu_);  // by caller
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);  // callers with calls waiting, in turn
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
};

// The callers' calls of this process (the default Limits).
CallerCalls& ProcessCallerCalls();

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CALLER_CALLS_H_
