#include "base/log_budget.h"

#include <algorithm>
#include <utility>

namespace optstep {

LogBudget::LogBudget(double per_second, double burst, Clock clock)
    : per_second_(per_second),
      burst_(burst),
      clock_(std::move(clock)),
      tokens_(burst),
      refilled_(clock_()) {}

bool LogBudget::Take(int64_t* dropped) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  if (now > refilled_) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - refilled_) * per_second_);
    refilled_ = now;
  }
  if (tokens_ < 1.0) {
    ++dropped_;
    return false;
  }
  tokens_ -= 1.0;
  if (dropped != nullptr) *dropped = dropped_;
  dropped_ = 0;
  return true;
}

LogBudget& CallerLogBudget() {
  static LogBudget* const budget = new LogBudget(/*per_second=*/20, /*burst=*/200);
  return *budget;
}

}  // namespace optstep
