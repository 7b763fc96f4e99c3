#include "kernels/comm/key_value_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace optstep {
namespace {

// Longest file name the store writes (most file systems allow 255 bytes; the temporary name
// adds a suffix).
constexpr size_t kMaxFileNameLength = 200;

// Waiting times between two looks at the directory: short at first, so that a key set a moment
// after the Get started costs little, then longer, so that long waits stay cheap.
constexpr absl::Duration kFirstPoll = absl::Milliseconds(1);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(20);

absl::Status DeadlineError(const std::string& key, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "key-value store: key '", key, "' was not set within ", absl::FormatDuration(timeout)));
}

absl::Status ErrnoError(absl::string_view what, const std::string& path, int error) {
  return absl::UnavailableError(
      absl::StrCat("key-value store: ", what, " '", path, "': ", std::strerror(error)));
}

class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    auto is_set = [this, &key]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.contains(key); };
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(&is_set), timeout)) {
      return DeadlineError(key, timeout);
    }
    return values_.at(key);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key. The file name is the key with every byte outside [A-Za-z0-9._-] written
// as %XX, so any key maps to one plain name in the directory (and '.'-prefixed names, which
// the temporary files use, never come from a key: '.' at the start is escaped too).
class FileKeyValueStore final : public KeyValueStore {
 public:
  explicit FileKeyValueStore(std::string directory) : directory_(std::move(directory)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    std::string name;
    if (absl::Status status = FileName(key, name); !status.ok()) return status;
    // The temporary name is unique among the processes and threads that share the directory.
    const std::string tmp =
        absl::StrCat(directory_, "/.tmp.", name, ".", getpid(), ".", counter_.fetch_add(1));
    const std::string path = absl::StrCat(directory_, "/", name);
    if (absl::Status status = MakeDirectories(directory_); !status.ok()) return status;
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot create", tmp, errno);
    size_t written = 0;
    while (written < value.size()) {
      const ssize_t n = write(fd, value.data() + written, value.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        close(fd);
        unlink(tmp.c_str());
        return ErrnoError("cannot write", tmp, error);
      }
      written += static_cast<size_t>(n);
    }
    if (close(fd) != 0) {
      const int error = errno;
      unlink(tmp.c_str());
      return ErrnoError("cannot close", tmp, error);
    }
    // rename() replaces `path` atomically: a reader sees the old value or the whole new one.
    if (rename(tmp.c_str(), path.c_str()) != 0) {
      const int error = errno;
      unlink(tmp.c_str());
      return ErrnoError("cannot rename to", path, error);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    std::string name;
    if (absl::Status status = FileName(key, name); !status.ok()) return status;
    const std::string path = absl::StrCat(directory_, "/", name);
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration poll = kFirstPoll;
    while (true) {
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) return ReadAll(fd, path);
      if (errno != ENOENT) return ErrnoError("cannot open", path, errno);
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return DeadlineError(key, timeout);
      absl::SleepFor(std::min(poll, left));
      poll = std::min(poll * 2, kMaxPoll);
    }
  }

 private:
  static absl::Status FileName(const std::string& key, std::string& name) {
    if (key.empty()) return absl::InvalidArgumentError("key-value store: empty key");
    name.clear();
    for (size_t i = 0; i < key.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(key[i]);
      const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '_' || c == '-' || (c == '.' && i > 0);
      if (plain) {
        name.push_back(static_cast<char>(c));
      } else {
        absl::StrAppendFormat(&name, "%%%02X", c);
      }
    }
    if (name.size() > kMaxFileNameLength) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key-value store: key '", key, "' is ", key.size(), " bytes; the file store takes",
          " keys up to about ", kMaxFileNameLength, " bytes"));
    }
    return absl::OkStatus();
  }

  // mkdir -p; a directory that another process creates meanwhile is fine.
  static absl::Status MakeDirectories(const std::string& directory) {
    for (size_t slash = directory.find('/', 1);; slash = directory.find('/', slash + 1)) {
      const std::string prefix = directory.substr(0, slash);
      if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError("cannot create directory", prefix, errno);
      }
      if (slash == std::string::npos) return absl::OkStatus();
    }
  }

  // Reads the whole file and closes `fd`.
  static absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
    std::string value;
    char buffer[4096];
    while (true) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        close(fd);
        return ErrnoError("cannot read", path, error);
      }
      if (n == 0) break;
      value.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    return value;
  }

  const std::string directory_;
  std::atomic<uint64_t> counter_{0};
};

class AbandoningKeyValueStore final : public KeyValueStore {
 public:
  AbandoningKeyValueStore(std::shared_ptr<KeyValueStore> inner,
                          std::function<absl::Status()> abandon, absl::Duration poll)
      : inner_(std::move(inner)), abandon_(std::move(abandon)), poll_(poll) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(key, value);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::StatusOr<std::string> value = inner_->Get(key, std::min(left, poll_));
      if (value.ok() || !absl::IsDeadlineExceeded(value.status())) return value;
      if (left <= poll_) return DeadlineError(key, timeout);
      const absl::Status abandoned = abandon_();
      if (!abandoned.ok()) {
        return absl::Status(abandoned.code(),
                            absl::StrCat("key-value store: the wait for key '", key,
                                         "' was abandoned: ", abandoned.message()));
      }
    }
  }

 private:
  const std::shared_ptr<KeyValueStore> inner_;
  const std::function<absl::Status()> abandon_;
  const absl::Duration poll_;
};

}  // namespace

std::shared_ptr<KeyValueStore> NewAbandoningKeyValueStore(std::shared_ptr<KeyValueStore> inner,
                                                          std::function<absl::Status()> abandon,
                                                          absl::Duration poll) {
  return std::make_shared<AbandoningKeyValueStore>(std::move(inner), std::move(abandon), poll);
}

std::shared_ptr<KeyValueStore> NewInMemoryKeyValueStore() {
  return std::make_shared<InMemoryKeyValueStore>();
}

std::shared_ptr<KeyValueStore> NewFileKeyValueStore(const std::string& directory) {
  return std::make_shared<FileKeyValueStore>(directory);
}

}  // namespace optstep
