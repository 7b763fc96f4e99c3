#include "server/rpc/caller_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/run_detached.h"

namespace optstep {

absl::Status CallerCalls::Run(const std::string& caller, const std::string& what,
                              std::function<void()> work, int64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    Queue& queue = queues_[caller];
    if (queue.waiting.empty() && queue.running < limits_.per_caller && running_ < limits_.total) {
      ++queue.running;
      ++running_;
    } else if (!queue.waiting.empty() &&
               queue.waiting_bytes + bytes > limits_.queued_bytes_per_caller) {
      // (One call waits whatever its size: the message limit bounds it.)
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": caller '", CallerText(caller), "' has calls of ", queue.waiting_bytes,
          " request bytes waiting on this rank already; this one's ", bytes, " would pass the ",
          limits_.queued_bytes_per_caller, " one caller may; retry when they ended"));
    } else if (queue.waiting.size() < limits_.queued_per_caller) {
      if (queue.waiting.empty()) turns_.push_back(caller);
      queue.waiting.push_back(Waiting{std::move(work), bytes});
      queue.waiting_bytes += bytes;
      ++queued_;
      return absl::OkStatus();
    } else {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": caller '", CallerText(caller), "' has ", limits_.queued_per_caller,
          " calls waiting on this rank already, the most one caller may; retry when they ended"));
    }
  }
  Start(caller, std::move(work));
  return absl::OkStatus();
}

void CallerCalls::Start(std::string caller, std::function<void()> work) {
  RunDetached([this, caller = std::move(caller), work = std::move(work)] {
    work();
    Done(caller);
  });
}

std::function<void()> CallerCalls::NextLocked(std::string* caller) {
  if (running_ >= limits_.total) return nullptr;
  for (size_t tries = turns_.size(); tries > 0; --tries) {
    std::string next = std::move(turns_.front());
    turns_.pop_front();
    Queue& queue = queues_[next];
    if (queue.running >= limits_.per_caller) {
      turns_.push_back(std::move(next));  // its turn comes again once one of its calls ended
      continue;
    }
    std::function<void()> work = std::move(queue.waiting.front().work);
    queue.waiting_bytes -= queue.waiting.front().bytes;
    queue.waiting.pop_front();
    --queued_;
    ++queue.running;
    ++running_;
    if (!queue.waiting.empty()) turns_.push_back(next);
    *caller = std::move(next);
    return work;
  }
  return nullptr;
}

void CallerCalls::Done(const std::string& caller) {
  std::string next_caller;
  std::function<void()> next;
  {
    absl::MutexLock lock(&mu_);
    --running_;
    auto it = queues_.find(caller);
    if (it != queues_.end() && --it->second.running == 0 && it->second.waiting.empty()) {
      queues_.erase(it);
    }
    next = NextLocked(&next_caller);
  }
  if (next) Start(std::move(next_caller), std::move(next));
}

int CallerCalls::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int CallerCalls::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

CallerCalls& ProcessCallerCalls() {
  static CallerCalls* const calls = new CallerCalls(CallerCalls::Limits());
  return *calls;
}

}  // namespace optstep
