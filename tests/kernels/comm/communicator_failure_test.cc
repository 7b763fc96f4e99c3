// The failure half of the conformance suite: argument validation, ranks that never join,
// collectives that time out, peers that disappear. Each failure must come back as the
// documented code within bounded time, never as a hang.

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/kernels/comm/communicator_conformance.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

using ::optstep::testutil::StatusIs;

TEST_P(CommunicatorConformanceTest, ArgumentsAreValidatedOnEveryRank) {
  RunRanks([&](int rank, Communicator& comm) {
    const int w = world_size();
    std::unique_ptr<CommBuffer> buffer = Upload(rank, std::vector<uint8_t>(64, 0));
    ASSERT_NE(buffer, nullptr);
    void* data = buffer->data();
    const auto kInvalid = absl::StatusCode::kInvalidArgument;

    EXPECT_THAT(comm.AllReduce(data, 4, CommDType::kUint8, ReduceOp::kSum),
                StatusIs(kInvalid, "dtype uint8 is not supported"));
    EXPECT_THAT(comm.AllReduce(data, -1, CommDType::kFloat32, ReduceOp::kSum),
                StatusIs(kInvalid, "data count -1 is negative"));
    EXPECT_THAT(comm.AllReduce(nullptr, 4, CommDType::kFloat32, ReduceOp::kMax),
                StatusIs(kInvalid, "data is null but its count is 4"));
    EXPECT_THAT(comm.AllReduce(data, 4, CommDType::kFloat32, static_cast<ReduceOp>(9)),
                StatusIs(kInvalid, "unknown reduce op 9"));

    std::vector<int64_t> counts(w, 1);
    EXPECT_THAT(comm.AllGatherV(data, 1, data, std::vector<int64_t>(w + 1, 1), CommDType::kUint8),
                StatusIs(kInvalid, absl::StrCat("recv_counts has ", w + 1,
                                                " entries; the world size is ", w)));
    EXPECT_THAT(comm.AllGatherV(data, 2, data, counts, CommDType::kUint8),
                StatusIs(kInvalid, absl::StrCat("rank ", rank, " sends 2 elements but recv_counts[",
                                                rank, "] = 1")));
    std::vector<int64_t> negative = counts;
    negative[w - 1] = -3;
    EXPECT_THAT(comm.AllGatherV(data, rank == w - 1 ? -3 : 1, data, negative, CommDType::kUint8),
                StatusIs(kInvalid, absl::StrCat("recv_counts[", w - 1, "] = -3 is negative")));
    EXPECT_THAT(comm.AllGatherV(nullptr, 1, data, counts, CommDType::kUint8),
                StatusIs(kInvalid, "send is null"));
    EXPECT_THAT(comm.AllGatherV(data, 1, nullptr, counts, CommDType::kUint8),
                StatusIs(kInvalid, "recv is null"));

    EXPECT_THAT(comm.Broadcast(data, 4, CommDType::kUint8, -1),
                StatusIs(kInvalid, absl::StrCat("root -1 is outside [0, ", w, ")")));
    EXPECT_THAT(comm.Broadcast(data, 4, CommDType::kUint8, w),
                StatusIs(kInvalid, absl::StrCat("root ", w, " is outside [0, ", w, ")")));
    EXPECT_THAT(comm.Broadcast(data, 4, static_cast<CommDType>(7), 0),
                StatusIs(kInvalid, "unknown dtype CommDType(7)"));

    // Nothing was sent: the group still works.
    std::unique_ptr<CommBuffer> one = Upload(rank, ToBytes(std::vector<float>{1.0f}));
    ASSERT_NE(one, nullptr);
    OPTSTEP_ASSERT_OK(comm.AllReduce(one->data(), 1, CommDType::kFloat32, ReduceOp::kSum));
    EXPECT_EQ(FromBytes<float>(Download(*one)), std::vector<float>{static_cast<float>(w)});
  });
}

TEST_P(CommunicatorConformanceTest, CreateRejectsBadOptions) {
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const int w = world_size();
  EXPECT_THAT(CreateCommunicator(Options(w, w, store, NewPrefix(), absl::Seconds(1))),
              StatusIs(kInvalid, absl::StrCat("rank ", w, " is outside [0, ", w, ")")));
  EXPECT_THAT(CreateCommunicator(Options(-1, w, store, NewPrefix(), absl::Seconds(1))),
              StatusIs(kInvalid, "rank -1 is outside"));
  EXPECT_THAT(CreateCommunicator(Options(0, 0, store, NewPrefix(), absl::Seconds(1))),
              StatusIs(kInvalid, "world_size 0 must be at least 1"));
  EXPECT_THAT(CreateCommunicator(Options(0, w, store, NewPrefix(), absl::ZeroDuration())),
              StatusIs(kInvalid, "timeout 0 must be positive"));
  if (kind().multi_rank) {
    EXPECT_THAT(CreateCommunicator(Options(0, 2, nullptr, NewPrefix(), absl::Seconds(1))),
                StatusIs(kInvalid, "world_size 2 needs a rendezvous store"));
  } else {
    EXPECT_THAT(CreateCommunicator(Options(0, 2, store, NewPrefix(), absl::Seconds(1))),
                StatusIs(kInvalid, "world_size 1, not 2"));
  }
}

// Creating a group returns only when every rank is connected, so a rank may close its
// communicator at once without failing a peer that is still connecting.
TEST_P(CommunicatorConformanceTest, GroupMayBeDestroyedRightAfterCreation) {
  for (int i = 0; i < 25; ++i) RunRanks([](int, Communicator&) {});
}

// A group of world_size() + 1 ranks whose last rank never comes: every rank that came gives
// up with DEADLINE_EXCEEDED after its timeout.
TEST_P(CommunicatorConformanceTest, RankThatNeverJoinsTimesOut) {
  if (!kind().multi_rank) GTEST_SKIP() << kind().kind << " has no groups of several ranks";
  const absl::Duration timeout = absl::Milliseconds(500);
  std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
  const std::string prefix = NewPrefix();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      const absl::Time start = absl::Now();
      EXPECT_THAT(CreateCommunicator(Options(rank, world_size() + 1, store, prefix, timeout)),
                  StatusIs(absl::StatusCode::kDeadlineExceeded))
          << "rank " << rank;
      const absl::Duration elapsed = absl::Now() - start;
      EXPECT_GE(elapsed, timeout * 0.9) << "rank " << rank;
      EXPECT_LT(elapsed, timeout + absl::Seconds(5)) << "rank " << rank;
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Rank 0 calls a collective that the others never call: DEADLINE_EXCEEDED after its timeout,
// then UNAVAILABLE at once. The others (with a long timeout of their own) learn that rank 0
// gave up when they next communicate.
TEST_P(CommunicatorConformanceTest, CollectiveTimesOutWhenPeersDoNotCall) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const absl::Duration timeout = absl::Seconds(1);
  std::vector<absl::Duration> timeouts(world_size(), absl::Seconds(30));
  timeouts[0] = timeout;
  std::vector<std::unique_ptr<Communicator>> group = CreateGroup(timeouts);
  ASSERT_EQ(group.size(), static_cast<size_t>(world_size()));

  absl::Notification rank0_gave_up;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      Communicator& comm = *group[rank];
      std::unique_ptr<CommBuffer> buffer = Upload(rank, std::vector<uint8_t>(4096, 1));
      ASSERT_NE(buffer, nullptr);
      if (rank == 0) {
        const absl::Time start = absl::Now();
        EXPECT_THAT(comm.AllReduce(buffer->data(), 1024, CommDType::kFloat32, ReduceOp::kSum),
                    StatusIs(absl::StatusCode::kDeadlineExceeded));
        const absl::Duration elapsed = absl::Now() - start;
        EXPECT_GE(elapsed, timeout * 0.9);
        EXPECT_LT(elapsed, timeout + absl::Seconds(5));
        rank0_gave_up.Notify();
        const absl::Time again = absl::Now();
        EXPECT_THAT(comm.Barrier(), StatusIs(absl::StatusCode::kUnavailable, "unusable"));
        EXPECT_LT(absl::Now() - again, absl::Milliseconds(100));
        return;
      }
      rank0_gave_up.WaitForNotification();
      const absl::Time start = absl::Now();
      const absl::Status status = comm.Barrier();
      if (kind().reports_peer_loss) {
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable)) << "rank " << rank;
        EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
      } else {
        EXPECT_FALSE(status.ok()) << "rank " << rank;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// The last rank disappears (its communicator is destroyed) after a barrier: the others'
// next collective answers UNAVAILABLE promptly, well before their 30 s timeout, and the
// communicator stays broken.
TEST_P(CommunicatorConformanceTest, LostPeerIsUnavailableNotAHang) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  if (!kind().reports_peer_loss) GTEST_SKIP() << kind().kind << " does not report lost peers";
  std::vector<std::unique_ptr<Communicator>> group =
      CreateGroup(std::vector<absl::Duration>(world_size(), absl::Seconds(30)));
  ASSERT_EQ(group.size(), static_cast<size_t>(world_size()));
  const int lost = world_size() - 1;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size(); ++rank) {
    threads.emplace_back([&, rank] {
      OPTSTEP_ASSERT_OK(group[rank]->Barrier());
      if (rank == lost) {
        group[rank].reset();
        return;
      }
      Communicator& comm = *group[rank];
      std::unique_ptr<CommBuffer> buffer = Upload(rank, std::vector<uint8_t>(4000, 0));
      ASSERT_NE(buffer, nullptr);
      const absl::Time start = absl::Now();
      EXPECT_THAT(comm.AllReduce(buffer->data(), 1000, CommDType::kFloat32, ReduceOp::kSum),
                  StatusIs(absl::StatusCode::kUnavailable))
          << "rank " << rank;
      EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank " << rank;
      EXPECT_THAT(comm.Barrier(), StatusIs(absl::StatusCode::kUnavailable, "unusable"))
          << "rank " << rank;
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
