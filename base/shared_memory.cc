#include "base/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

absl::Status ErrnoError(int error, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Maps `fd` of `bytes` shared and read-write; closes it on failure.
absl::StatusOr<char*> Map(int fd, size_t bytes, const std::string& what) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return ErrnoError(error, absl::StrCat("mapping ", what));
  }
  return static_cast<char*>(data);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(size_t bytes,
                                                                   const std::string& name) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared memory segment of 0 bytes");
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("memfd_create '", name, "'"));
  const std::string what = absl::StrCat("segment '", name, "' of ", bytes, " bytes");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(error, absl::StrCat("sizing ", what));
  }
  absl::StatusOr<char*> data = Map(fd, bytes, what);
  if (!data.ok()) return data.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory(fd, *data, bytes));
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& path,
                                                                 size_t bytes) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("opening shared memory '", path, "'"));
  struct stat st;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory '", path, "' is not a sealed segment of ", bytes, " bytes"));
  }
  absl::StatusOr<char*> data = Map(fd, bytes, absl::StrCat("shared memory '", path, "'"));
  if (!data.ok()) return data.status();
  return std::unique_ptr<SharedMemory>(new SharedMemory(fd, *data, bytes));
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  close(fd_);
}

std::string SharedMemory::path() const { return absl::StrCat("/proc/", getpid(), "/fd/", fd_); }

}  // namespace optstep
