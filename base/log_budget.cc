#include "base/log_budget.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

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

namespace {

std::atomic<LogBudget*> caller_budget_override{nullptr};

}  // namespace

LogBudget& CallerLogBudget() {
  static LogBudget* const budget = new LogBudget(/*per_second=*/20, /*burst=*/200);
  LogBudget* const override = caller_budget_override.load(std::memory_order_acquire);
  return override != nullptr ? *override : *budget;
}

std::string DroppedBefore(int64_t dropped) {
  return dropped > 0 ? absl::StrCat(" dropped_before=", dropped) : std::string();
}

ScopedCallerLogBudget::ScopedCallerLogBudget(LogBudget* budget) {
  caller_budget_override.store(budget, std::memory_order_release);
}

ScopedCallerLogBudget::~ScopedCallerLogBudget() {
  caller_budget_override.store(nullptr, std::memory_order_release);
}

}  // namespace optstep
