#include "tests/kernels/comm/communicator_conformance.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

class HostBuffer final : public CommBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {}
  void* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }
  absl::Status Write(const std::vector<uint8_t>& bytes) override {
    if (bytes.size() != bytes_.size()) return absl::InvalidArgumentError("size mismatch");
    bytes_ = bytes;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<uint8_t>> Read() override { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

absl::StatusOr<std::unique_ptr<CommBuffer>> AllocateHost(int /*rank*/, size_t bytes) {
  return NewHostBuffer(bytes);
}

}  // namespace

std::unique_ptr<CommBuffer> NewHostBuffer(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

CommKind LocalKind() {
  CommKind kind;
  kind.name = "Local";
  kind.kind = "local";
  kind.world_sizes = {1};
  kind.multi_rank = false;
  kind.allocate = AllocateHost;
  return kind;
}

CommKind GlooKind() {
  CommKind kind;
  kind.name = "Gloo";
  kind.kind = "gloo";
  kind.world_sizes = {1, 2, 3, 4};
  kind.allocate = AllocateHost;
  return kind;
}

std::vector<CommParam> ExpandWorldSizes(const CommKind& kind) {
  std::vector<CommParam> params;
  for (int world_size : kind.world_sizes) params.push_back(CommParam{kind, world_size});
  return params;
}

void PrintTo(const CommParam& param, std::ostream* os) {
  *os << param.kind.name << " world " << param.world_size;
}

std::string ParamName(const ::testing::TestParamInfo<CommParam>& info) {
  return absl::StrCat(info.param.kind.name, "_World", info.param.world_size);
}

CommunicatorOptions CommunicatorConformanceTest::Options(int rank, int world_size,
                                                         std::shared_ptr<KeyValueStore> store,
                                                         const std::string& prefix,
                                                         absl::Duration timeout) const {
  CommunicatorOptions options;
  options.kind = kind().kind;
  options.rank = rank;
  options.world_size = world_size;
  options.prefix = prefix;
  options.store = std::move(store);
  options.hostname = "127.0.0.1";
  options.device_ordinal = rank;
  options.timeout = timeout;
  return options;
}

void CommunicatorConformanceTest::RunRanks(
    const std::function<void(int rank, Communicator& comm)>& body, absl::Duration timeout) {
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  const std::string prefix = NewPrefix();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          CreateCommunicator(Options(rank, world_size(), store, prefix, timeout));
      ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status();
      ASSERT_EQ((*comm)->rank(), rank);
      ASSERT_EQ((*comm)->world_size(), world_size());
      body(rank, **comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

std::vector<std::unique_ptr<Communicator>> CommunicatorConformanceTest::CreateGroup(
    const std::vector<absl::Duration>& timeouts) {
  const int size = static_cast<int>(timeouts.size());
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  const std::string prefix = NewPrefix();
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> comms(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      comms[rank] = CreateCommunicator(Options(rank, size, store, prefix, timeouts[rank]));
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<std::unique_ptr<Communicator>> group;
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(comms[rank].ok()) << "rank " << rank << ": " << comms[rank].status();
    if (!comms[rank].ok()) return {};
    group.push_back(*std::move(comms[rank]));
  }
  return group;
}

std::unique_ptr<CommBuffer> CommunicatorConformanceTest::Upload(int rank,
                                                                const std::vector<uint8_t>& bytes) {
  absl::StatusOr<std::unique_ptr<CommBuffer>> buffer = kind().allocate(rank, bytes.size());
  EXPECT_TRUE(buffer.ok()) << "rank " << rank << ": " << buffer.status();
  if (!buffer.ok()) return nullptr;
  const absl::Status written = (*buffer)->Write(bytes);
  EXPECT_TRUE(written.ok()) << "rank " << rank << ": " << written;
  if (!written.ok()) return nullptr;
  return *std::move(buffer);
}

std::vector<uint8_t> CommunicatorConformanceTest::Download(CommBuffer& buffer) {
  absl::StatusOr<std::vector<uint8_t>> bytes = buffer.Read();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *std::move(bytes) : std::vector<uint8_t>();
}

std::string CommunicatorConformanceTest::NewPrefix() {
  static std::atomic<int> next{0};
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(test != nullptr ? test->name() : "group", "/", next.fetch_add(1));
}

}  // namespace testing_internal
}  // namespace optstep
