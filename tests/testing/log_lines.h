#ifndef OPTSTEP_TESTS_TESTING_LOG_LINES_H_
#define OPTSTEP_TESTS_TESTING_LOG_LINES_H_

#include <ctime>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"

namespace optstep {
namespace testutil {

// The lines glog writes in this process while it lives (their messages, without the prefix).
// Thread-safe.
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;

  void send(google::LogSeverity, const char*, const char*, int, const std::tm*, const char* message,
            size_t length) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }
  std::vector<std::string> lines() const {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_LOG_LINES_H_
