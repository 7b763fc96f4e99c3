#include "checkpoint/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace internal {

absl::Status ErrnoStatus(int error, absl::string_view op, absl::string_view path) {
  const std::string message = absl::StrCat(op, " '", path, "': ", std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

absl::StatusOr<File> OpenForWrite(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "create", path);
  return File(fd);
}

absl::StatusOr<File> OpenForRead(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open", path);
  return File(fd);
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat("read '", path, "': file ends at byte ", offset, ", ", n, " bytes short"));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status Fsync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return ErrnoStatus(errno, "fsync", path);
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open for fsync", path);
  File file(fd);
  return Fsync(fd, path);
}

absl::StatusOr<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return absl::NotFoundError(absl::StrCat("'", path, "' is not a file"));
  return static_cast<uint64_t>(st.st_size);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, "list", path);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, "stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    absl::StatusOr<std::vector<std::string>> names = ListDir(path);
    if (!names.ok()) {
      return names.status().code() == absl::StatusCode::kNotFound ? absl::OkStatus()
                                                                  : names.status();
    }
    for (const std::string& name : *names) {
      OPTSTEP_RETURN_IF_ERROR(RemoveTree(absl::StrCat(path, "/", name)));
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "remove directory", path);
    }
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "remove", path);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  OPTSTEP_ASSIGN_OR_RETURN(File file, OpenForRead(path));
  OPTSTEP_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
  if (size > max_bytes) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' has ", size, " bytes, more than the limit of ", max_bytes));
  }
  std::string contents(size, '\0');
  OPTSTEP_RETURN_IF_ERROR(PreadAll(file.fd(), contents.data(), size, 0, path));
  return contents;
}

absl::Status WriteSmallFile(const std::string& path, absl::string_view contents) {
  OPTSTEP_ASSIGN_OR_RETURN(File file, OpenForWrite(path));
  OPTSTEP_RETURN_IF_ERROR(WriteAll(file.fd(), contents.data(), contents.size(), path));
  return Fsync(file.fd(), path);
}

}  // namespace internal
}  // namespace optstep
