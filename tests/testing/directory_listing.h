#ifndef OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_
#define OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_

// What a test sees of a directory on disk: whether a path exists and which entries a directory
// holds, for tests that check what a save, a failed save or a sweep left behind. Stateless.

#include <string>
#include <vector>

namespace optstep {
namespace testutil {

// Whether `path` names anything (a symbolic link itself, not its target).
bool PathExists(const std::string& path);

// Entry names of `dir`, hidden ones included, without "." and "..", sorted;
// {"(cannot list)"} when `dir` cannot be opened, so that an expectation on the names fails.
std::vector<std::string> DirectoryEntries(const std::string& dir);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_DIRECTORY_LISTING_H_
