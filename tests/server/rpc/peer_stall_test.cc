// A peer that hangs, rather than dies, mid-stream: its connection stays up, so only the pause
// between its messages tells. A heal's fetch from it (PeerFetch, through RankGroup::ReadState)
// is cancelled once no chunk came for the group's timeout, naming the rank and what was fetched;
// a slow peer whose stream keeps moving is not, however long the whole fetch takes. A unary call
// to it (RankGroup::CallPeer) lasts while it answers its pings, and ends once it does not.

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/comm/key_value_store.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "server/rpc/heal.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/rendezvous.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

constexpr int kElements = 12;

// One fp32 element of tensor "w" (kElements long) at `offset`.
v1::StateDictChunk Element(int offset) {
  v1::StateDictChunk chunk;
  chunk.set_key("w");
  chunk.add_shape(kElements);
  chunk.set_offset(offset);
  chunk.set_dtype(v1::DTYPE_FP32);
  const float value = static_cast<float>(offset);
  chunk.set_data(&value, sizeof(value));
  return chunk;
}

// Rank 0's FetchOwnedState: sends tensor "w" an element at a time, `pause` apart; with `hang`,
// stops after the first one until the call is cancelled (or `kHangCap` passed: then ends the
// stream, still incomplete).
class ScriptedPeer final : public v1::PeerService::Service {
 public:
  static constexpr absl::Duration kHangCap = absl::Seconds(20);

  ScriptedPeer(absl::Duration pause, bool hang, bool pings_hang)
      : pause_(pause), hang_(hang), pings_hang_(pings_hang) {}

  grpc::Status FetchOwnedState(grpc::ServerContext* context, const v1::FetchStateRequest*,
                               grpc::ServerWriter<v1::StateDictChunk>* writer) override {
    for (int i = 0; i < kElements; ++i) {
      if (i > 0) absl::SleepFor(pause_);
      if (!writer->Write(Element(i))) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
      if (!hang_) continue;
      const absl::Time cap = absl::Now() + kHangCap;
      while (!context->IsCancelled() && absl::Now() < cap) absl::SleepFor(absl::Milliseconds(10));
      hang_ended_.Notify();
      return grpc::Status::OK;
    }
    return grpc::Status::OK;
  }

  // A shard written in `pause`; with `hang`, once the call is cancelled (or `kHangCap` passed).
  grpc::Status SaveShard(grpc::ServerContext* context, const v1::HeldSessionRequest*,
                         v1::HeldSessionResponse* response) override {
    const absl::Time end = absl::Now() + (hang_ ? kHangCap : pause_);
    while (!context->IsCancelled() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
    response->set_shard_file("shard-1");
    return grpc::Status::OK;
  }
  // Answered, but after kHangCap (or its cancellation) with `pings_hang`: a stopped process.
  grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest*,
                    v1::PingResponse*) override {
    const absl::Time cap = absl::Now() + kHangCap;
    while (pings_hang_ && !context->IsCancelled() && absl::Now() < cap) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return grpc::Status::OK;
  }

  absl::Notification hang_ended_;

 private:
  const absl::Duration pause_;
  const bool hang_;
  const bool pings_hang_;
};

// Rank 1 of 2 whose rank 0 is `peer`, served on loopback; streams pausing `timeout` are cut,
// and calls whose peer has not answered a ping for twice `peer_timeout`.
class PeerStallTest : public ::testing::Test {
 protected:
  void Serve(absl::Duration pause, bool hang, absl::Duration timeout,
             absl::Duration peer_timeout = absl::Milliseconds(200)) {
    ServeWithPings(pause, hang, /*pings_hang=*/hang, timeout, peer_timeout);
  }
  void ServeWithPings(absl::Duration pause, bool hang, bool pings_hang, absl::Duration timeout,
                      absl::Duration peer_timeout) {
    peer_ = std::make_unique<ScriptedPeer>(pause, hang, pings_hang);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(peer_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
    ASSERT_TRUE(store->Set(RankAddressKey(0), absl::StrCat("127.0.0.1:", port)).ok());
    RankGroupOptions options;
    options.rank = 1;
    options.world_size = 2;
    options.timeout = timeout;
    options.heartbeat_interval = absl::Milliseconds(50);
    options.peer_timeout = peer_timeout;
    group_ = std::make_unique<RankGroup>(options, nullptr);
    ASSERT_TRUE(group_->Join("127.0.0.1:1", store).ok());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::unique_ptr<ScriptedPeer> peer_;  // outlives the server
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<RankGroup> group_;
};

TEST_F(PeerStallTest, AFetchFromAPeerThatHangsMidStreamIsCancelledNamingIt) {
  Serve(absl::ZeroDuration(), /*hang=*/true, absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const StateDict>> fetched =
      PeerFetch(group_.get())(0, "s", HealPart::kOwned);
  EXPECT_THAT(fetched.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                         "rank 0: no progress for 300ms while fetching its own "
                                         "state of session 's'"));
  EXPECT_LT(absl::Now() - start, ScriptedPeer::kHangCap / 2);
  // The peer saw the call cancelled; it did not end its stream by itself.
  EXPECT_TRUE(peer_->hang_ended_.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

TEST_F(PeerStallTest, ASlowPeerWhoseStreamKeepsMovingIsNotCut) {
  // The whole fetch takes eleven pauses, longer than the limit; no single pause comes near it.
  Serve(absl::Milliseconds(100), /*hang=*/false, absl::Seconds(1));
  absl::StatusOr<std::shared_ptr<const StateDict>> fetched =
      PeerFetch(group_.get())(0, "s", HealPart::kOwned);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  const StateTensor& w = (*fetched)->at("w");
  ASSERT_EQ(w.bytes.size(), kElements * sizeof(float));
  for (int i = 0; i < kElements; ++i) {
    float value;
    std::memcpy(&value, w.bytes.data() + i * sizeof(float), sizeof(value));
    EXPECT_EQ(value, static_cast<float>(i));
  }
}

// A unary call that moves state (SaveShard) has no deadline: it lasts as long as the peer answers
// its pings, however much longer than the peer timeout that is.
TEST_F(PeerStallTest, ACallToAPeerThatAnswersItsPingsTakesAsLongAsItNeeds) {
  Serve(absl::Seconds(1), /*hang=*/false, absl::Seconds(1));
  ASSERT_TRUE(group_->EnsureAddress(0).ok());
  absl::StatusOr<v1::HeldSessionResponse> saved = group_->CallPeer(
      0, &v1::PeerService::Stub::SaveShard, v1::HeldSessionRequest(), "writing", absl::Hours(1));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->shard_file(), "shard-1");
}

// Once the peer stops answering its pings too (a stopped process, a lost host), the call is
// cancelled twice the peer timeout after the last answer, naming the rank and what it waited for.
TEST_F(PeerStallTest, ACallToAPeerThatStoppedAnsweringIsCancelledNamingIt) {
  Serve(absl::ZeroDuration(), /*hang=*/true, absl::Seconds(1));
  ASSERT_TRUE(group_->EnsureAddress(0).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::HeldSessionResponse> saved =
      group_->CallPeer(0, &v1::PeerService::Stub::SaveShard, v1::HeldSessionRequest(),
                       "waiting for its shard to be written", absl::Hours(1));
  EXPECT_THAT(saved.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "rank 0: no progress for 400ms while waiting for its shard to be written"));
  EXPECT_LT(absl::Now() - start, ScriptedPeer::kHangCap / 2);
}

// A call that ended while a ping of its watch was under way returns at once: the ping is
// cancelled, not waited for to its deadline (the peer timeout, here 5 s).
TEST_F(PeerStallTest, ACallThatEndsWhileAPingHangsReturnsAtOnce) {
  ServeWithPings(absl::Milliseconds(300), /*hang=*/false, /*pings_hang=*/true, absl::Seconds(1),
                 absl::Seconds(5));
  ASSERT_TRUE(group_->EnsureAddress(0).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::HeldSessionResponse> saved = group_->CallPeer(
      0, &v1::PeerService::Stub::SaveShard, v1::HeldSessionRequest(), "writing", absl::Hours(1));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace optstep
