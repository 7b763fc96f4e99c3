#ifndef OPTSTEP_BASE_SHARED_MEMORY_H_
#define OPTSTEP_BASE_SHARED_MEMORY_H_

// A memory segment that processes of one host share: an anonymous memfd of a fixed size, sealed
// against shrinking and growing (no process that opens it can truncate it under another's reads,
// which would end them with SIGBUS), mapped read-write and shared. Another process of the same
// user opens it at path(), the creator's /proc/<pid>/fd/<fd>; the kernel lets no other user do
// so. Thread-compatible; the memory itself is shared with other processes, which the users of a
// segment must order (here, by the messages of the RPCs that name it).

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace optstep {

class SharedMemory {
 public:
  // Creates a zero-filled segment of `bytes` (> 0); `name` shows in the fd's link (debugging).
  // RESOURCE_EXHAUSTED when the system refuses the memory; INTERNAL for other failures.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(size_t bytes,
                                                              const std::string& name);
  // Maps the segment another process created, at `path`, which must be `bytes` long and sealed
  // against shrinking (INVALID_ARGUMENT naming what differs). NOT_FOUND / PERMISSION_DENIED as the
  // kernel answers the open.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Open(const std::string& path, size_t bytes);

  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  // Where another process of this host and user opens it: "/proc/<pid>/fd/<fd>".
  std::string path() const;

 private:
  SharedMemory(int fd, char* data, size_t size) : fd_(fd), data_(data), size_(size) {}

  const int fd_;
  char* const data_;
  const size_t size_;
};

}  // namespace optstep

#endif  // OPTSTEP_BASE_SHARED_MEMORY_H_
