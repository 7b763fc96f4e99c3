#ifndef OPTSTEP_CHECKPOINT_FILE_UTIL_H_
#define OPTSTEP_CHECKPOINT_FILE_UTIL_H_

// POSIX file helpers of the checkpoint package: errno translated to absl::Status with the path
// in the message (ENOENT -> NOT_FOUND, EEXIST/ENOTEMPTY -> ALREADY_EXISTS, ENOSPC ->
// RESOURCE_EXHAUSTED, EACCES -> PERMISSION_DENIED, else INTERNAL). Stateless.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {
namespace internal {

absl::Status ErrnoStatus(int error, absl::string_view op, absl::string_view path);

// A file descriptor closed on destruction. Move-only.
class File final {
 public:
  File() = default;
  explicit File(int fd) : fd_(fd) {}
  ~File();
  File(File&& other) noexcept : fd_(other.release()) {}
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

absl::StatusOr<File> OpenForWrite(const std::string& path);  // create or truncate
absl::StatusOr<File> OpenForRead(const std::string& path);
absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path);
// Exactly `n` bytes at `offset`; DATA_LOSS when the file ends first.
absl::Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path);
absl::Status Fsync(int fd, const std::string& path);
absl::Status FsyncPath(const std::string& path);  // a file or directory by name
absl::StatusOr<uint64_t> FileSize(const std::string& path);
bool Exists(const std::string& path);
// OK when absent, also when another process removes entries meanwhile.
absl::Status RemoveTree(const std::string& path);
// Entry names of a directory, without "." and "..", sorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);
// Writes `contents` to `path` and fsyncs it.
absl::Status WriteSmallFile(const std::string& path, absl::string_view contents);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_FILE_UTIL_H_
