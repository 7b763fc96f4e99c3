// FaultInjectingCommunicator: forwards each collective to the same collective of the wrapped
// communicator with the same arguments, fails exactly the calls it was told to (without
// forwarding them, or after), and corrupts the first element of a result.

#include "tests/testing/fault_injecting_communicator.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testutil {
namespace {

// Answers every collective with UNIMPLEMENTED naming the collective and its arguments, so that a
// test sees which call arrived with what.
class RecordingCommunicator final : public Communicator {
 public:
  int rank() const override { return 1; }
  int world_size() const override { return 3; }
  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override {
    return Record("AllReduce", data, count, static_cast<int>(dtype), static_cast<int>(op));
  }
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override {
    return Record("AllGatherV", send, send_count, recv, &recv_counts, static_cast<int>(dtype));
  }
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override {
    return Record("Broadcast", data, count, static_cast<int>(dtype), root);
  }
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override {
    return Record("RingShift", send, send_count, recv, recv_count, static_cast<int>(dtype));
  }
  absl::Status Barrier() override { return Record("Barrier"); }

  template <typename... Args>
  static absl::Status Record(const char* method, const Args&... args) {
    std::ostringstream out;
    out << method;
    ((out << ' ' << args), ...);
    return absl::UnimplementedError(out.str());
  }
};

TEST(FaultInjectingCommunicatorTest, ForwardsEveryCollectiveWithItsArguments) {
  FaultInjectingCommunicator comm(std::make_unique<RecordingCommunicator>());
  using R = RecordingCommunicator;
  EXPECT_EQ(comm.rank(), 1);
  EXPECT_EQ(comm.world_size(), 3);
  float data[4];
  std::vector<int64_t> counts = {1, 2, 1};
  EXPECT_EQ(comm.AllReduce(data, 4, CommDType::kFloat64, ReduceOp::kMax),
            R::Record("AllReduce", static_cast<void*>(data), 4, 1, 1));
  EXPECT_EQ(comm.AllGatherV(data + 1, 2, data, counts, CommDType::kUint8),
            R::Record("AllGatherV", static_cast<const void*>(data + 1), 2, static_cast<void*>(data),
                      &counts, 2));
  EXPECT_EQ(comm.Broadcast(data, 3, CommDType::kFloat32, 2),
            R::Record("Broadcast", static_cast<void*>(data), 3, 0, 2));
  EXPECT_EQ(comm.RingShift(data, 1, data + 2, 2, CommDType::kFloat32),
            R::Record("RingShift", static_cast<const void*>(data), 1, static_cast<void*>(data + 2),
                      2, 0));
  EXPECT_EQ(comm.Barrier(), R::Record("Barrier"));
  for (const char* method : {"AllReduce", "AllGatherV", "Broadcast", "RingShift", "Barrier"}) {
    EXPECT_EQ(comm.faults().calls(method), 1) << method;
  }
}

class LocalFaultInjectingCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Communicator>> local = CreateCommunicator(CommunicatorOptions{});
    ASSERT_THAT(local.status(), IsOk());
    comm_ = std::make_unique<FaultInjectingCommunicator>(*std::move(local));
  }
  std::unique_ptr<FaultInjectingCommunicator> comm_;
};

TEST_F(LocalFaultInjectingCommunicatorTest, FailsExactlyTheNthCallWithoutForwardingIt) {
  comm_->faults().FailCall("AllGatherV", 2, absl::UnavailableError("injected: peer lost"));
  const float send[2] = {1, 2};
  float recv[2] = {0, 0};
  ASSERT_THAT(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32), IsOk());
  EXPECT_EQ(recv[1], 2);
  recv[0] = recv[1] = 0;
  EXPECT_EQ(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32),
            absl::UnavailableError("injected: peer lost"));
  EXPECT_EQ(recv[0], 0);  // not forwarded: nothing was copied
  ASSERT_THAT(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32), IsOk());
  EXPECT_EQ(recv[0], 1);
  EXPECT_EQ(comm_->faults().calls("AllGatherV"), 3);
  // The wrapped communicator's own answers come through unchanged.
  EXPECT_THAT(comm_->AllReduce(recv, -1, CommDType::kFloat32, ReduceOp::kSum),
              StatusIs(absl::StatusCode::kInvalidArgument, "data count -1 is negative"));
}

TEST_F(LocalFaultInjectingCommunicatorTest, FailsTheNthCallAfterForwardingIt) {
  comm_->faults().FailAfterCall("AllGatherV", 1, absl::UnavailableError("injected: send broke"));
  const float send[2] = {1, 2};
  float recv[2] = {0, 0};
  EXPECT_EQ(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32),
            absl::UnavailableError("injected: send broke"));
  EXPECT_EQ(recv[0], 1);  // forwarded: the collective ran
  EXPECT_EQ(recv[1], 2);
  ASSERT_THAT(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32), IsOk());
}

TEST_F(LocalFaultInjectingCommunicatorTest, CorruptsTheFirstElementOfTheResult) {
  comm_->faults().CorruptCall("AllReduce", 1);
  comm_->faults().CorruptCall("AllGatherV", 1);
  comm_->faults().CorruptCall("Broadcast", 1);
  double sums[2] = {3, 4};
  ASSERT_THAT(comm_->AllReduce(sums, 2, CommDType::kFloat64, ReduceOp::kSum), IsOk());
  EXPECT_TRUE(std::isnan(sums[0]));
  EXPECT_EQ(sums[1], 4);
  const float send[2] = {1, 2};
  float recv[2] = {0, 0};
  ASSERT_THAT(comm_->AllGatherV(send, 2, recv, {2}, CommDType::kFloat32), IsOk());
  EXPECT_TRUE(std::isnan(recv[0]));
  EXPECT_EQ(recv[1], 2);
  uint8_t bytes[2] = {0x0f, 0x01};
  ASSERT_THAT(comm_->Broadcast(bytes, 2, CommDType::kUint8, 0), IsOk());
  EXPECT_EQ(bytes[0], 0xf0);
  EXPECT_EQ(bytes[1], 0x01);
  // Only the call it was told.
  ASSERT_THAT(comm_->AllReduce(sums, 1, CommDType::kFloat64, ReduceOp::kSum), IsOk());
  sums[0] = 5;
  ASSERT_THAT(comm_->AllReduce(sums, 1, CommDType::kFloat64, ReduceOp::kSum), IsOk());
  EXPECT_EQ(sums[0], 5);
}

}  // namespace
}  // namespace testutil
}  // namespace optstep
