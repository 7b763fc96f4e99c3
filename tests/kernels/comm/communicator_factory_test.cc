// CreateCommunicator's choice of implementation and its errors for kinds it cannot create.

#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/key_value_store.h"
#include "kernels/device_factory.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

// Rank `rank` of a gloo pair meeting in `store` under `prefix`.
CommunicatorOptions GlooPair(int rank, std::shared_ptr<KeyValueStore> store,
                             const std::string& prefix, absl::Duration timeout) {
  CommunicatorOptions options;
  options.kind = "gloo";
  options.rank = rank;
  options.world_size = 2;
  options.prefix = prefix;
  options.store = std::move(store);
  options.timeout = timeout;
  return options;
}

TEST(CommunicatorFactoryTest, UnknownKindIsInvalidArgument) {
  CommunicatorOptions options;
  options.kind = "mpi";
  EXPECT_THAT(CreateCommunicator(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown communicator kind 'mpi' (expected local, gloo or nccl)"));
}

TEST(CommunicatorFactoryTest, TheKindFollowsTheDeviceMemory) {
  CommunicatorOptions options;
  ASSERT_TRUE(ResolveCommunicatorKind("auto", "cpu", &options).ok());
  EXPECT_EQ(options.kind, "gloo");
  ASSERT_TRUE(ResolveCommunicatorKind("auto", "cuda:3", &options).ok());
  EXPECT_EQ(options.kind, "nccl");
  EXPECT_EQ(options.device_ordinal, 3);
  ASSERT_TRUE(ResolveCommunicatorKind("nccl", "cuda:0", &options).ok());
  EXPECT_EQ(options.device_ordinal, 0);
  EXPECT_THAT(ResolveCommunicatorKind("gloo", "cuda:1", &options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "communicator 'gloo' moves host memory but the device is cuda:1"));
  EXPECT_THAT(ResolveCommunicatorKind("nccl", "cpu", &options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "communicator 'nccl' needs a CUDA device, not cpu"));
  // Other kinds are CreateCommunicator's to refuse.
  ASSERT_TRUE(ResolveCommunicatorKind("local", "cpu", &options).ok());
  EXPECT_EQ(options.kind, "local");
}

TEST(CommunicatorFactoryTest, LocalIsAGroupOfOne) {
  CommunicatorOptions options;
  options.kind = "local";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm, CreateCommunicator(options));
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
}

TEST(CommunicatorFactoryTest, GlooOfOneRankNeedsNoStore) {
  CommunicatorOptions options;
  options.kind = "gloo";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> comm, CreateCommunicator(options));
  EXPECT_EQ(comm->world_size(), 1);
  float x = 3.0f;
  OPTSTEP_EXPECT_OK(comm->AllReduce(&x, 1, CommDType::kFloat32, ReduceOp::kSum));
  EXPECT_EQ(x, 3.0f);
}

// 192.0.2.1 (TEST-NET-1) is no address of this machine: the device cannot bind to it.
TEST(CommunicatorFactoryTest, GlooOnAForeignAddressIsUnavailable) {
  CommunicatorOptions options;
  options.kind = "gloo";
  options.world_size = 2;
  options.store = NewInMemoryKeyValueStore();
  options.hostname = "192.0.2.1";
  options.timeout = absl::Seconds(2);
  EXPECT_THAT(CreateCommunicator(options),
              StatusIs(absl::StatusCode::kUnavailable, "cannot open a TCP device on '192.0.2.1'"));
}

// Gloo writes without MSG_NOSIGNAL: a peer that dies must fail a collective, not kill the
// process with SIGPIPE.
TEST(CommunicatorFactoryTest, GlooIgnoresSigpipe) {
  signal(SIGPIPE, SIG_DFL);
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([store, rank] {
      OPTSTEP_EXPECT_OK(
          CreateCommunicator(GlooPair(rank, store, "sigpipe", absl::Seconds(20))).status());
    });
  }
  for (std::thread& rank : ranks) rank.join();
  struct sigaction action;
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &action), 0);
  EXPECT_EQ(action.sa_handler, SIG_IGN);
}

// The connect timeout bounds the connections only: a rank that comes to the rendezvous late, or
// to any collective late (by more than the pairs' default timeout, a fifth of the connect
// timeout), is waited for up to the communicator's timeout.
constexpr absl::Duration kLate = absl::Milliseconds(800);

TEST(CommunicatorFactoryTest, GlooWaitsForALateRankAndLateCollectives) {
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([store, rank] {
      CommunicatorOptions options = GlooPair(rank, store, "late", absl::Seconds(30));
      options.connect_timeout = absl::Seconds(2);
      if (rank == 1) absl::SleepFor(2 * kLate);  // comes late
      absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateCommunicator(options);
      OPTSTEP_ASSERT_OK(comm.status());
      // Rank 0 enters every collective late.
      const auto late = [rank] {
        if (rank == 0) absl::SleepFor(kLate);
      };
      float x = 1.0f + rank;
      late();
      OPTSTEP_EXPECT_OK((*comm)->AllReduce(&x, 1, CommDType::kFloat32, ReduceOp::kSum));
      EXPECT_EQ(x, 3.0f);
      float y = 0.0f;
      late();
      OPTSTEP_EXPECT_OK((*comm)->RingShift(&x, 1, &y, 1, CommDType::kFloat32));
      EXPECT_EQ(y, 3.0f);
      float both[2] = {0.0f, 0.0f};
      const float mine = 10.0f + rank;
      late();
      OPTSTEP_EXPECT_OK((*comm)->AllGatherV(&mine, 1, both, {1, 1}, CommDType::kFloat32));
      EXPECT_EQ(both[0], 10.0f);
      EXPECT_EQ(both[1], 11.0f);
      float root = rank == 1 ? 7.0f : 0.0f;
      late();
      OPTSTEP_EXPECT_OK((*comm)->Broadcast(&root, 1, CommDType::kFloat32, /*root=*/1));
      EXPECT_EQ(root, 7.0f);
      late();
      OPTSTEP_EXPECT_OK((*comm)->Barrier());
    });
  }
  for (std::thread& rank : ranks) rank.join();
}

TEST(CommunicatorFactoryTest, NcclNeedsACudaBuild) {
  if (BuiltWithCuda())
    GTEST_SKIP() << "this build has CUDA: see communicator_conformance_nccl_test";
  CommunicatorOptions options;
  options.kind = "nccl";
  EXPECT_THAT(CreateCommunicator(options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "communicator 'nccl': this build has no CUDA support; rebuild with "
                       "--config=cuda"));
}

}  // namespace
}  // namespace optstep
