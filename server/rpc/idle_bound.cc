#include "server/rpc/idle_bound.h"

#include <utility>

#include "base/log_budget.h"
#include "glog/logging.h"

namespace optstep {

bool IdleBound::bounded() const {
  return timeout_ > absl::ZeroDuration() && timeout_ != absl::InfiniteDuration();
}

void IdleBound::Start(absl::Duration timeout, std::function<void()> fire) {
  timeout_ = timeout;
  if (!bounded()) return;
  fire_ = std::move(fire);
  Arm(absl::Now() + timeout_);
}

void IdleBound::Waiting() {
  if (waiting_) return;
  waiting_ = true;
  since_ = absl::Now();
}

void IdleBound::Heard() {
  waiting_ = false;
  since_ = absl::Now();
}

std::optional<absl::Duration> IdleBound::Passed() {
  if (!fire_) return std::nullopt;  // stopped
  const absl::Time now = absl::Now();
  if (waiting_ && now - since_ >= timeout_) return now - since_;
  Arm((waiting_ ? since_ : now) + timeout_);
  return std::nullopt;
}

std::unique_ptr<grpc::Alarm> IdleBound::Stop() {
  fire_ = nullptr;
  return std::move(alarm_);
}

void IdleBound::Arm(absl::Time at) {
  fired_ = std::move(alarm_);  // it went off: its callback is running or has run
  alarm_ = std::make_unique<grpc::Alarm>();
  alarm_->Set(absl::ToChronoTime(at), [fire = fire_](bool went_off) {
    if (went_off) fire();  // else cancelled (Stop, or the stream's end)
  });
}

std::shared_ptr<CallIdleWatch> CallIdleWatch::Start(grpc::CallbackServerContext* context,
                                                    absl::Duration timeout, const char* what,
                                                    Waits waits) {
  std::shared_ptr<CallIdleWatch> watch(new CallIdleWatch(context, timeout, what, waits));
  std::weak_ptr<CallIdleWatch> weak = watch;
  absl::MutexLock lock(&watch->mu_);
  watch->bound_.Start(timeout, [weak] {
    if (auto self = weak.lock()) self->OnAlarm();
  });
  return watch;
}

CallIdleWatch::~CallIdleWatch() { Stop(); }

void CallIdleWatch::Waiting() {
  absl::MutexLock lock(&mu_);
  bound_.Waiting();
}

void CallIdleWatch::Heard() {
  absl::MutexLock lock(&mu_);
  bound_.Heard();
}

std::optional<absl::Duration> CallIdleWatch::idled() const {
  absl::MutexLock lock(&mu_);
  return idled_;
}

void CallIdleWatch::Stop() {
  std::unique_ptr<grpc::Alarm> alarm;
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    alarm = bound_.Stop();
  }
  alarm.reset();  // cancels: its callback returns at once, without the lock
}

void CallIdleWatch::OnAlarm() {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr || idled_) return;
  idled_ = bound_.Passed();
  if (!idled_) return;
  int64_t dropped = 0;  // a caller may leave stream after stream idle
  if (CallerLogBudget().Take(&dropped)) {
    LOG(WARNING) << "event=stream_idle stream=" << what_ << " waited=\""
                 << absl::FormatDuration(*idled_) << "\" idle_timeout=\""
                 << absl::FormatDuration(timeout_) << "\" reason=\""
                 << (waits_ == Waits::kReads ? "the caller sends nothing"
                                             : "the caller does not take what is written")
                 << "\"" << DroppedBefore(dropped);
  }
  context_->TryCancel();  // thread-safe: the read or write out fails, and OnCancel comes
}

}  // namespace optstep
