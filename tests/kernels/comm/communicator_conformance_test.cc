// The collectives of the conformance suite: results against references computed here with
// plain loops. Data are small integers, so every sum is exact in float32 and float64 whatever
// order a communicator reduces in: results must equal the references exactly.

#include "tests/kernels/comm/communicator_conformance.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

// Rank `rank`'s element `i`: an integer in [-500, 503].
double Value(int rank, int64_t i) {
  return static_cast<double>((i * 7 + rank * 131) % 1000 - 500 + rank);
}

// Element counts: one element, a few, and more than Gloo's 1 MiB segment so that a ring
// all-reduce splits the buffer into several segments per rank.
const int64_t kCounts[] = {1, 5, 1000, 300001};

// Host bytes of `values` as `dtype` (float32 or float64).
std::vector<uint8_t> AsBytes(const std::vector<double>& values, CommDType dtype) {
  if (dtype == CommDType::kFloat64) return ToBytes(values);
  return ToBytes(std::vector<float>(values.begin(), values.end()));
}

std::vector<double> FromDTypeBytes(const std::vector<uint8_t>& bytes, CommDType dtype) {
  if (dtype == CommDType::kFloat64) return FromBytes<double>(bytes);
  const std::vector<float> values = FromBytes<float>(bytes);
  return std::vector<double>(values.begin(), values.end());
}

}  // namespace

void CommunicatorConformanceTest::CheckAllReduce(CommDType dtype, ReduceOp op) {
  for (int64_t count : kCounts) {
    std::vector<double> expected(count);
    for (int64_t i = 0; i < count; ++i) {
      double reduced = Value(0, i);
      for (int r = 1; r < world_size(); ++r) {
        reduced = op == ReduceOp::kSum ? reduced + Value(r, i) : std::max(reduced, Value(r, i));
      }
      expected[i] = reduced;
    }
    RunRanks([&](int rank, Communicator& comm) {
      std::vector<double> values(count);
      for (int64_t i = 0; i < count; ++i) values[i] = Value(rank, i);
      std::unique_ptr<CommBuffer> buffer = Upload(rank, AsBytes(values, dtype));
      ASSERT_NE(buffer, nullptr);
      OPTSTEP_ASSERT_OK(comm.AllReduce(buffer->data(), count, dtype, op));
      const std::vector<double> got = FromDTypeBytes(Download(*buffer), dtype);
      ASSERT_EQ(got.size(), expected.size());
      int64_t mismatches = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (got[i] != expected[i] && ++mismatches <= 3) {
          ADD_FAILURE() << "rank " << rank << " count " << count << " element " << i << ": got "
                        << got[i] << ", expected " << expected[i];
        }
      }
      EXPECT_EQ(mismatches, 0) << "rank " << rank << " count " << count;
    });
  }
}

void CommunicatorConformanceTest::CheckAllGatherV(const std::vector<int64_t>& counts,
                                                  CommDType dtype, bool in_place) {
  ASSERT_EQ(counts.size(), static_cast<size_t>(world_size()));
  const size_t element = CommDTypeSize(dtype);
  std::vector<int64_t> offsets(counts.size());
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = total;
    total += counts[r];
  }
  auto block = [&](int rank) {
    std::vector<uint8_t> bytes(counts[rank] * element);
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(i * 31 + rank * 17 + 1);
    }
    return bytes;
  };
  std::vector<uint8_t> expected;
  for (int r = 0; r < world_size(); ++r) {
    const std::vector<uint8_t> b = block(r);
    expected.insert(expected.end(), b.begin(), b.end());
  }
  RunRanks([&](int rank, Communicator& comm) {
    // The receive buffer starts as 0xEE everywhere (this rank's block too unless in place).
    std::vector<uint8_t> initial(total * element, 0xEE);
    const std::vector<uint8_t> own = block(rank);
    if (in_place) std::copy(own.begin(), own.end(), initial.begin() + offsets[rank] * element);
    std::unique_ptr<CommBuffer> recv = Upload(rank, initial);
    ASSERT_NE(recv, nullptr);
    std::unique_ptr<CommBuffer> send;
    const void* send_ptr = static_cast<uint8_t*>(recv->data()) + offsets[rank] * element;
    if (!in_place) {
      send = Upload(rank, own);
      ASSERT_NE(send, nullptr);
      send_ptr = send->data();
    }
    OPTSTEP_ASSERT_OK(comm.AllGatherV(send_ptr, counts[rank], recv->data(), counts, dtype));
    EXPECT_EQ(Download(*recv), expected) << "rank " << rank;
  });
}

namespace {

TEST_P(CommunicatorConformanceTest, AllReduceSumFloat32) {
  CheckAllReduce(CommDType::kFloat32, ReduceOp::kSum);
}
TEST_P(CommunicatorConformanceTest, AllReduceSumFloat64) {
  CheckAllReduce(CommDType::kFloat64, ReduceOp::kSum);
}
TEST_P(CommunicatorConformanceTest, AllReduceMaxFloat32) {
  CheckAllReduce(CommDType::kFloat32, ReduceOp::kMax);
}
TEST_P(CommunicatorConformanceTest, AllReduceMaxFloat64) {
  CheckAllReduce(CommDType::kFloat64, ReduceOp::kMax);
}

TEST_P(CommunicatorConformanceTest, AllReduceOfNothingIsOk) {
  RunRanks([&](int rank, Communicator& comm) {
    OPTSTEP_EXPECT_OK(comm.AllReduce(nullptr, 0, CommDType::kFloat32, ReduceOp::kSum));
  });
}

TEST_P(CommunicatorConformanceTest, AllGatherVUnequalCounts) {
  const std::vector<int64_t> pattern = {3, 1000, 7, 70001};
  std::vector<int64_t> counts;
  for (int r = 0; r < world_size(); ++r) counts.push_back(pattern[r % pattern.size()]);
  CheckAllGatherV(counts, CommDType::kFloat32, /*in_place=*/false);
  CheckAllGatherV(counts, CommDType::kFloat64, /*in_place=*/true);
}

TEST_P(CommunicatorConformanceTest, AllGatherVZeroCounts) {
  // Every other rank contributes nothing; then only the last rank contributes.
  std::vector<int64_t> alternate;
  for (int r = 0; r < world_size(); ++r) alternate.push_back(r % 2 == 0 ? 0 : 1001);
  CheckAllGatherV(alternate, CommDType::kUint8, /*in_place=*/false);
  std::vector<int64_t> last_only(world_size(), 0);
  last_only.back() = 5;
  CheckAllGatherV(last_only, CommDType::kFloat32, /*in_place=*/true);
}

TEST_P(CommunicatorConformanceTest, AllGatherVOfNothingIsOk) {
  CheckAllGatherV(std::vector<int64_t>(world_size(), 0), CommDType::kFloat32, /*in_place=*/false);
}

TEST_P(CommunicatorConformanceTest, BroadcastFromEveryRoot) {
  for (CommDType dtype : {CommDType::kUint8, CommDType::kFloat64}) {
    const int64_t count = dtype == CommDType::kUint8 ? 1001 : 200003;
    const size_t bytes = count * CommDTypeSize(dtype);
    auto data = [&](int rank) {
      std::vector<uint8_t> b(bytes);
      for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 13 + rank * 101);
      return b;
    };
    for (int root = 0; root < world_size(); ++root) {
      RunRanks([&](int rank, Communicator& comm) {
        std::unique_ptr<CommBuffer> buffer = Upload(rank, data(rank));
        ASSERT_NE(buffer, nullptr);
        OPTSTEP_ASSERT_OK(comm.Broadcast(buffer->data(), count, dtype, root));
        EXPECT_EQ(Download(*buffer), data(root)) << "rank " << rank << " root " << root;
      });
    }
  }
}

TEST_P(CommunicatorConformanceTest, RingShiftHandsEachRankItsPredecessorsBuffer) {
  // Rank r sends count(r) bytes (unequal, one rank sending nothing) and receives its
  // predecessor's; twice in a row, so that consecutive shifts do not mix.
  const int n = world_size();
  auto count = [&](int rank) -> int64_t {
    return rank == n - 1 && n > 1 ? 0 : 1000 + 70001 * rank;
  };
  auto data = [&](int rank, int round) {
    std::vector<uint8_t> b(count(rank));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + rank * 101 + round);
    return b;
  };
  RunRanks([&](int rank, Communicator& comm) {
    const int previous = (rank + n - 1) % n;
    for (int round = 0; round < 2; ++round) {
      std::unique_ptr<CommBuffer> send = Upload(rank, data(rank, round));
      std::unique_ptr<CommBuffer> recv = Upload(rank, std::vector<uint8_t>(count(previous), 0xEE));
      ASSERT_NE(send, nullptr);
      ASSERT_NE(recv, nullptr);
      OPTSTEP_ASSERT_OK(comm.RingShift(send->data(), count(rank), recv->data(), count(previous),
                                       CommDType::kUint8));
      EXPECT_EQ(Download(*recv), data(previous, round)) << "rank " << rank << " round " << round;
    }
  });
}

TEST_P(CommunicatorConformanceTest, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  RunRanks([&](int rank, Communicator& comm) {
    // Later ranks arrive later: nobody may leave the barrier before the last one arrived.
    absl::SleepFor(absl::Milliseconds(40) * rank);
    arrived.fetch_add(1);
    OPTSTEP_ASSERT_OK(comm.Barrier());
    EXPECT_EQ(arrived.load(), world_size()) << "rank " << rank << " left the barrier early";
  });
}

TEST_P(CommunicatorConformanceTest, ManyCollectivesInSequence) {
  RunRanks([&](int rank, Communicator& comm) {
    for (int iteration = 0; iteration < 20; ++iteration) {
      std::unique_ptr<CommBuffer> one = Upload(rank, ToBytes(std::vector<double>{1.0 + rank}));
      ASSERT_NE(one, nullptr);
      OPTSTEP_ASSERT_OK(comm.AllReduce(one->data(), 1, CommDType::kFloat64, ReduceOp::kSum));
      const double n = world_size();
      EXPECT_EQ(FromBytes<double>(Download(*one)), std::vector<double>{n * (n + 1) / 2});

      std::vector<int64_t> counts(world_size(), 1);
      std::unique_ptr<CommBuffer> own = Upload(rank, {static_cast<uint8_t>(rank + iteration)});
      std::unique_ptr<CommBuffer> all = Upload(rank, std::vector<uint8_t>(world_size(), 0));
      ASSERT_NE(own, nullptr);
      ASSERT_NE(all, nullptr);
      OPTSTEP_ASSERT_OK(comm.AllGatherV(own->data(), 1, all->data(), counts, CommDType::kUint8));
      std::vector<uint8_t> expected;
      for (int r = 0; r < world_size(); ++r)
        expected.push_back(static_cast<uint8_t>(r + iteration));
      EXPECT_EQ(Download(*all), expected);

      std::unique_ptr<CommBuffer> value = Upload(rank, {static_cast<uint8_t>(rank)});
      ASSERT_NE(value, nullptr);
      const int root = iteration % world_size();
      OPTSTEP_ASSERT_OK(comm.Broadcast(value->data(), 1, CommDType::kUint8, root));
      EXPECT_EQ(Download(*value), std::vector<uint8_t>{static_cast<uint8_t>(root)});
      OPTSTEP_ASSERT_OK(comm.Barrier());
    }
  });
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
