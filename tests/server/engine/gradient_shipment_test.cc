// GradientShipment: the rounds every rank runs whatever it owns, what arrives where, how far
// WaitSent lets the owned update go while a round is in flight, and a failed round.

#include "server/engine/gradient_shipment.h"

#include <cstdint>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// One rank's view of a ring whose predecessor sends `predecessor` (element i = 1000 + i). Each
// RingShift is a round: it records its counts, copies the predecessor's elements of the round into
// `recv`, and may wait for the test (hold) or fail (fail_at).
class ScriptedRing final : public Communicator {
 public:
  ScriptedRing(int64_t predecessor_count, int64_t round_elements)
      : round_elements_(round_elements), predecessor_(predecessor_count) {
    std::iota(predecessor_.begin(), predecessor_.end(), 1000.0f);
  }

  int rank() const override { return 1; }
  int world_size() const override { return 3; }
  absl::Status AllReduce(void*, int64_t, CommDType, ReduceOp) override { return Unused(); }
  absl::Status AllGatherV(const void*, int64_t, void*, const std::vector<int64_t>&,
                          CommDType) override {
    return Unused();
  }
  absl::Status Broadcast(void*, int64_t, CommDType, int) override { return Unused(); }
  absl::Status Barrier() override { return Unused(); }
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override {
    EXPECT_EQ(dtype, CommDType::kFloat32);
    EXPECT_EQ(send == nullptr, send_count == 0);
    EXPECT_EQ(recv == nullptr, recv_count == 0);
    const int round = static_cast<int>(rounds_.size());
    rounds_.emplace_back(send_count, recv_count);
    if (round == hold_at) release.WaitForNotification();
    if (round == fail_at) return absl::UnavailableError("the buddy is gone");
    const float* from = predecessor_.data() + round * round_elements_;
    std::copy(from, from + recv_count, static_cast<float*>(recv));
    return absl::OkStatus();
  }

  // (sent, received) by round, once the shipment was waited for.
  const std::vector<std::pair<int64_t, int64_t>>& rounds() const { return rounds_; }
  const std::vector<float>& predecessor() const { return predecessor_; }

  int hold_at = -1;  // this round waits for `release`
  absl::Notification release;
  int fail_at = -1;  // this round fails

 private:
  static absl::Status Unused() { return absl::InternalError("not a shipment's collective"); }

  const int64_t round_elements_;
  std::vector<float> predecessor_;
  std::vector<std::pair<int64_t, int64_t>> rounds_;  // on the shipment's thread
};

// Rank 1 of three ranks owning 10, 3 and 7 elements: it sends 3 and receives rank 0's 10.
constexpr int64_t kRound = 4;
const std::vector<int64_t> kBlocks = {10, 3, 7};

TEST(GradientShipmentTest, EveryRankRunsTheRoundsOfTheLargestBlock) {
  ScriptedRing ring(kBlocks[0], kRound);
  std::vector<float> own(kBlocks[1], 1.0f);
  std::vector<float> shadow(kBlocks[0], 0.0f);
  SerialExecutor thread;
  {
    GradientShipment shipment(&ring, own.data(), kBlocks[1], shadow.data(), kBlocks[0], kBlocks,
                              &thread, kRound);
    EXPECT_THAT(shipment.Wait(), IsOk());
  }
  using Round = std::pair<int64_t, int64_t>;
  EXPECT_EQ(ring.rounds(), (std::vector<Round>{{3, 4}, {0, 4}, {0, 2}}));
  EXPECT_EQ(shadow, ring.predecessor());
}

TEST(GradientShipmentTest, WaitSentAnswersOnceTheRoundThatCarriesTheElementsEnded) {
  ScriptedRing ring(/*predecessor_count=*/3, kRound);
  ring.hold_at = 1;
  std::vector<float> own(kBlocks[0], 1.0f);  // as rank 0 of the same ring: 10 out, 3 in
  std::vector<float> shadow(3, 0.0f);
  SerialExecutor thread;
  GradientShipment shipment(&ring, own.data(), kBlocks[0], shadow.data(), 3, kBlocks, &thread,
                            kRound);
  // Round 0 carries elements 0-3 and ends; round 1 waits: the update may read the first four.
  absl::StatusOr<int64_t> sent = shipment.WaitSent(2);
  ASSERT_THAT(sent, IsOk());
  EXPECT_EQ(*sent, 4);
  ring.release.Notify();
  sent = shipment.WaitSent(9);
  ASSERT_THAT(sent, IsOk());
  EXPECT_GE(*sent, 9);
  EXPECT_THAT(shipment.Wait(), IsOk());
  sent = shipment.WaitSent(10);
  ASSERT_THAT(sent, IsOk());
  EXPECT_EQ(*sent, 10);
}

TEST(GradientShipmentTest, AFailedRoundEndsTheShipmentWithItsError) {
  ScriptedRing ring(kBlocks[0], kRound);
  ring.fail_at = 1;
  std::vector<float> own(kBlocks[1], 1.0f);
  std::vector<float> shadow(kBlocks[0], 0.0f);
  SerialExecutor thread;
  GradientShipment shipment(&ring, own.data(), kBlocks[1], shadow.data(), kBlocks[0], kBlocks,
                            &thread, kRound);
  // Rank 1's three elements went out in round 0, yet once a round failed every wait answers its
  // error: the step is lost with the peer.
  EXPECT_THAT(shipment.Wait(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(shipment.WaitSent(3), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(ring.rounds().size(), 2u) << "no round after the failed one";
}

TEST(GradientShipmentTest, ARankThatOwnsNothingStillTakesPartInEveryRound) {
  ScriptedRing ring(kBlocks[0], kRound);
  std::vector<float> shadow(kBlocks[0], 0.0f);
  SerialExecutor thread;
  GradientShipment shipment(&ring, nullptr, 0, shadow.data(), kBlocks[0], {10, 0, 7}, &thread,
                            kRound);
  EXPECT_THAT(shipment.Wait(), IsOk());
  absl::StatusOr<int64_t> sent = shipment.WaitSent(0);
  ASSERT_THAT(sent, IsOk());
  EXPECT_EQ(*sent, 0);
  EXPECT_EQ(ring.rounds().size(), 3u);
  EXPECT_EQ(shadow, ring.predecessor());
}

}  // namespace
}  // namespace optstep
