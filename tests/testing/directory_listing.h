#ifndef OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_
#define OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_

// What a test sees of a directory on disk: whether a path exists and which entries a directory
// holds, for tests that check what a save, a failed save or a sweep left behind; and a temporary
// directory that lives as long as the test needs it. Stateless but for ScopedTempDir.

#include <string>
#include <vector>

namespace optstep {
namespace testutil {

// Whether `path` names anything (a symbolic link itself, not its target).
bool PathExists(const std::string& path);

// Entry names of `dir`, hidden ones included, without "." and "..", sorted;
// {"(cannot list)"} when `dir` cannot be opened, so that an expectation on the names fails.
std::vector<std::string> DirectoryEntries(const std::string& dir);

// A fresh directory "<system temp>/<prefix>-XXXXXX", removed with everything in it at the end.
// Thread-compatible.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "optstep-test");
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_
