#ifndef OPTSTEP_BASE_LOG_BUDGET_H_
#define OPTSTEP_BASE_LOG_BUDGET_H_

// A budget for the log lines that callers can cause (a refused call, a failed call, a stream
// ended for them): a caller that fails call after call must not fill the rank's disk with log
// lines nor slow it down writing them.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace optstep {

// A token bucket of lines: `per_second` lines a second on average, up to `burst` at once. Take()
// answers whether to write the line now; the lines refused are counted, and the next line let
// through is told how many (so that the log says "and 1234 more like it"). Thread-safe.
class LogBudget {
 public:
  using Clock = std::function<absl::Time()>;
  LogBudget(
      double per_second, double burst, Clock clock = [] { return absl::Now(); });
  LogBudget(const LogBudget&) = delete;
  LogBudget& operator=(const LogBudget&) = delete;

  // True: write the line, and `*dropped` lines were dropped since the last one written (may be
  // null). False: the line is dropped and counted.
  bool Take(int64_t* dropped) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const double per_second_;
  const double burst_;
  const Clock clock_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// The budget that the server's lines about callers share: 20 lines a second, bursts of 200.
LogBudget& CallerLogBudget();

// " dropped_before=N" for the N lines a budget dropped before this one (LogBudget::Take), empty
// for none: the end of the line written.
std::string DroppedBefore(int64_t dropped);

// Testing only: CallerLogBudget answers `budget` until this goes (one at a time).
class ScopedCallerLogBudget {
 public:
  explicit ScopedCallerLogBudget(LogBudget* budget);
  ~ScopedCallerLogBudget();
  ScopedCallerLogBudget(const ScopedCallerLogBudget&) = delete;
  ScopedCallerLogBudget& operator=(const ScopedCallerLogBudget&) = delete;
};

}  // namespace optstep

#endif  // OPTSTEP_BASE_LOG_BUDGET_H_
