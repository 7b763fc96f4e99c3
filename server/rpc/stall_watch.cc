#include "server/rpc/stall_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace optstep {

StallWatch::StallWatch(grpc::ClientContext* context, absl::Duration limit)
    : context_(context), limit_(limit), last_progress_(absl::Now()), thread_([this] { Watch(); }) {}

StallWatch::~StallWatch() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  thread_.join();
}

void StallWatch::Progressed() {
  absl::MutexLock lock(&mu_);
  last_progress_ = absl::Now();
}

bool StallWatch::stalled() const {
  absl::MutexLock lock(&mu_);
  return stalled_;
}

absl::Status StallWatch::Explain(absl::Status status, int rank, absl::string_view what) const {
  if (!absl::IsCancelled(status) || !stalled()) return status;
  return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": no progress for ",
                                                  absl::FormatDuration(limit_), " while ", what,
                                                  "; the call was cancelled (the peer hangs)"));
}

void StallWatch::Watch() {
  {
    absl::MutexLock lock(&mu_);
    // Each wait ends at the limit counted from the last progress, which may have moved meanwhile.
    while (!mu_.AwaitWithDeadline(absl::Condition(&done_), last_progress_ + limit_)) {
      if (absl::Now() >= last_progress_ + limit_) {
        stalled_ = true;
        break;
      }
    }
    if (!stalled_) return;
  }
  context_->TryCancel();  // thread-safe; the caller's next Read or Write fails
}

ProgressWhileAnswering::ProgressWhileAnswering(StallWatch* watch, Ping answers,
                                               absl::Duration interval)
    : watch_(watch),
      answers_(std::move(answers)),
      interval_(interval),
      thread_([this] { Ask(); }) {}

ProgressWhileAnswering::~ProgressWhileAnswering() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    // Thread-safe, and effective on a call not started yet: the ping then fails at once.
    if (ping_ != nullptr) ping_->TryCancel();
  }
  thread_.join();
}

void ProgressWhileAnswering::Ask() {
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), interval_)) return;
      ping_ = &context;
    }
    const bool answered = answers_(&context);
    {
      absl::MutexLock lock(&mu_);
      ping_ = nullptr;
    }
    if (answered) watch_->Progressed();
  }
}

}  // namespace optstep
