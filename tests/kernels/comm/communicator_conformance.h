#ifndef OPTSTEP_TESTS_KERNELS_COMM_COMMUNICATOR_CONFORMANCE_H_
#define OPTSTEP_TESTS_KERNELS_COMM_COMMUNICATOR_CONFORMANCE_H_

// The Communicator conformance suite: TEST_Ps that every kind must pass, each run with its
// ranks as threads of the test process (rendezvous through an InMemoryKeyValueStore). Each
// test binary instantiates it for the kinds it can run:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, CommunicatorConformanceTest,
//                            ::testing::ValuesIn(ExpandWorldSizes(GlooKind())), ParamName);
//
// Buffers come from the kind's `allocate` (host memory, or the GPU of the rank), so the same
// tests drive host and device communicators. Test-only.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/key_value_store.h"

namespace optstep {
namespace testing_internal {

// A buffer in the memory that one rank's communicator works on.
class CommBuffer {
 public:
  virtual ~CommBuffer() = default;
  // The pointer handed to the communicator.
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  // Copies size() bytes from / to the host.
  virtual absl::Status Write(const std::vector<uint8_t>& bytes) = 0;
  virtual absl::StatusOr<std::vector<uint8_t>> Read() = 0;
};

// A buffer in host memory (for "local" and "gloo").
std::unique_ptr<CommBuffer> NewHostBuffer(size_t bytes);

struct CommKind {
  std::string name;  // for test names: "Gloo"
  std::string kind;  // CommunicatorOptions::kind
  std::vector<int> world_sizes;
  // Whether groups of more than one rank exist (false for "local").
  bool multi_rank = true;
  // Whether a lost peer or a peer's timeout reaches the other ranks as UNAVAILABLE before
  // their own timeout (gloo closes its connections); otherwise they may also time out.
  bool reports_peer_loss = true;
  // A buffer of `bytes` bytes for rank `rank` (whose communicator uses device ordinal `rank`).
  std::function<absl::StatusOr<std::unique_ptr<CommBuffer>>(int rank, size_t bytes)> allocate;
};

struct CommParam {
  CommKind kind;
  int world_size = 1;
};

// For gtest's messages: "Gloo world 3".
void PrintTo(const CommParam& param, std::ostream* os);

CommKind LocalKind();
CommKind GlooKind();

// One parameter per world size of `kind`.
std::vector<CommParam> ExpandWorldSizes(const CommKind& kind);
// "Gloo_World3".
std::string ParamName(const ::testing::TestParamInfo<CommParam>& info);

class CommunicatorConformanceTest : public ::testing::TestWithParam<CommParam> {
 protected:
  int world_size() const { return GetParam().world_size; }
  const CommKind& kind() const { return GetParam().kind; }

  // Options of rank `rank` in a group of `world_size` ranks.
  CommunicatorOptions Options(int rank, int world_size, std::shared_ptr<KeyValueStore> store,
                              const std::string& prefix, absl::Duration timeout) const;

  // Creates a group of world_size() ranks, one thread each, and runs `body` on every rank with
  // its communicator; the communicator is destroyed when `body` returns.
  void RunRanks(const std::function<void(int rank, Communicator& comm)>& body,
                absl::Duration timeout = absl::Seconds(20));

  // Creates a group of timeouts.size() ranks concurrently, rank r with timeouts[r]; empty
  // (after a test failure) when some rank could not be created.
  std::vector<std::unique_ptr<Communicator>> CreateGroup(
      const std::vector<absl::Duration>& timeouts);

  // A buffer for `rank` holding `bytes` (ASSERTs inside on failure: check HasFatalFailure).
  std::unique_ptr<CommBuffer> Upload(int rank, const std::vector<uint8_t>& bytes);
  std::vector<uint8_t> Download(CommBuffer& buffer);

  // A store prefix that no other group of this process uses.
  static std::string NewPrefix();

  // Checks of communicator_conformance_test.cc, run by several tests each.
  // All-reduce of rank-dependent integers (float32 or float64) at several sizes.
  void CheckAllReduce(CommDType dtype, ReduceOp op);
  // All-gather-v where rank r contributes counts[r] elements of `dtype`, optionally in place.
  void CheckAllGatherV(const std::vector<int64_t>& counts, CommDType dtype, bool in_place);
};

// Host bytes <-> typed values.
template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& values) {
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  return std::vector<uint8_t>(p, p + values.size() * sizeof(T));
}

template <typename T>
std::vector<T> FromBytes(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

}  // namespace testing_internal
}  // namespace optstep

#endif  // OPTSTEP_TESTS_KERNELS_COMM_COMMUNICATOR_CONFORMANCE_H_
