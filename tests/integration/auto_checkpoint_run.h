#ifndef OPTSTEP_TESTS_INTEGRATION_AUTO_CHECKPOINT_RUN_H_
#define OPTSTEP_TESTS_INTEGRATION_AUTO_CHECKPOINT_RUN_H_

// A group of real server processes saving automatic checkpoints, and a client of it: what the
// automatic checkpoint tests share.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"

namespace optstep {
namespace testutil {

// A temporary checkpoint root, removed at the end.
class TempDir : public ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("optstep-auto") {}
};

struct Running {
  std::vector<std::unique_ptr<ServerProcess>> group;
  std::unique_ptr<Client> client;
};

// A group of `world` ranks with `flags`, and a client of all of them once rank 0 serves.
absl::StatusOr<Running> StartRunning(int world, const std::vector<std::string>& flags);

// The flags of a group that saves every step under `root`.
std::vector<std::string> AutoFlags(const std::string& root);

// Steps `first`..`last` of the session (StepSmall).
absl::Status StepRange(Client& client, const std::string& session, uint64_t first, uint64_t last);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_AUTO_CHECKPOINT_RUN_H_
