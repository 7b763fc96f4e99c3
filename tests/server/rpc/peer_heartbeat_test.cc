// PeerHeartbeat judges a peer only on rounds this rank ran on time: a round that ended well past
// its deadline was this rank's own stall (a paused machine or container), and the answers it
// missed say nothing of the peer. A peer that stops answering is still lost, also when a stall
// comes first. Every ping tells where the group keeps its store while rank 0 is stood in. A fake
// peer answers the pings, and a clock of the test's own stands for the time a stall takes.

#include "server/rpc/peer_heartbeat.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "optstep/v1/internal.grpc.pb.h"

namespace optstep {
namespace {

constexpr absl::Duration kInterval = absl::Milliseconds(50);
constexpr absl::Duration kTimeout = absl::Seconds(1);

// The test's clock: the real one plus what the stalls added.
class StallClock {
 public:
  absl::Time Now() const { return absl::Now() + absl::Nanoseconds(skipped_ns_.load()); }
  void Skip(absl::Duration d) { skipped_ns_ += absl::ToInt64Nanoseconds(d); }

 private:
  std::atomic<int64_t> skipped_ns_{0};
};

// Rank 1: answers every ping at once, except the pings it is told to stall (the clock jumps by
// `stall` as if this rank's heartbeat had been paused, and the answer comes after the deadline)
// and, once told, no ping at all.
class FakePeer final : public v1::PeerService::CallbackService {
 public:
  explicit FakePeer(StallClock* clock, uint64_t incarnation = 7)
      : clock_(clock), incarnation_(incarnation) {}
  ~FakePeer() override {
    for (std::thread& t : late_) t.join();
  }

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override {
    response->set_rank(1);
    response->set_incarnation(incarnation_);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    ++pings_;
    rendezvous_ = request->rendezvous();
    knows_group_formed_ = request->knows_group_formed();
    if (stalls_ > 0 || silent_) {
      if (stalls_ > 0) {
        --stalls_;
        clock_->Skip(absl::Milliseconds(1500));
      }
      late_.emplace_back([reactor] {
        absl::SleepFor(3 * kInterval);
        reactor->Finish(grpc::Status::OK);
      });
      return reactor;
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // The next `n` pings stall.
  void Stall(int n) {
    absl::MutexLock lock(&mu_);
    stalls_ = n;
  }
  void GoSilent() {
    absl::MutexLock lock(&mu_);
    silent_ = true;
  }
  int pings() {
    absl::MutexLock lock(&mu_);
    return pings_;
  }
  // What the last ping said of the group's store (PingRequest.rendezvous).
  std::string rendezvous() {
    absl::MutexLock lock(&mu_);
    return rendezvous_;
  }
  // Whether the last ping said its rank knows the group formed.
  bool knows_group_formed() {
    absl::MutexLock lock(&mu_);
    return knows_group_formed_;
  }

 private:
  StallClock* const clock_;
  const uint64_t incarnation_;
  absl::Mutex mu_;
  int stalls_ ABSL_GUARDED_BY(mu_) = 0;
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
  int pings_ ABSL_GUARDED_BY(mu_) = 0;
  std::string rendezvous_ ABSL_GUARDED_BY(mu_);
  bool knows_group_formed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> late_ ABSL_GUARDED_BY(mu_);
};

class PeerHeartbeatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Serve(&peer_, &stub_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    heartbeat_.reset();
    server_->Shutdown();
    if (replacement_server_ != nullptr) replacement_server_->Shutdown();
  }

  // Serves `peer` on a port of its own; `stub` calls it.
  static std::unique_ptr<grpc::Server> Serve(FakePeer* peer,
                                             std::unique_ptr<v1::PeerService::Stub>* stub) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(peer);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    *stub = v1::PeerService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                         grpc::InsecureChannelCredentials()));
    return server;
  }

  // `stub_of` (the stub of rank 1 at each round): the fake peer's by default. `rendezvous`: the
  // store each ping tells of (null: none).
  void Start(PeerHeartbeat::StubOf stub_of = nullptr,
             std::function<std::string()> rendezvous = nullptr,
             std::function<bool()> knows_group_formed = nullptr) {
    PeerHeartbeat::Options options;
    options.rank = 0;
    options.world_size = 2;
    options.interval = kInterval;
    options.clock = [this] { return clock_.Now(); };
    options.rendezvous = std::move(rendezvous);
    options.knows_group_formed = std::move(knows_group_formed);
    if (stub_of == nullptr) stub_of = [this](int) { return stub_.get(); };
    heartbeat_ =
        std::make_unique<PeerHeartbeat>(options, &liveness_, std::move(stub_of),
                                        [this](const PeerLiveness::LostPeer&) { ++lost_; });
  }
  // Waits until the peer got `n` more pings.
  void AwaitPings(int n) {
    const int until = peer_.pings() + n;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (peer_.pings() < until && absl::Now() < deadline) absl::SleepFor(kInterval / 5);
    ASSERT_GE(peer_.pings(), until);
  }

  StallClock clock_;
  FakePeer peer_{&clock_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::PeerService::Stub> stub_;
  FakePeer replacement_{&clock_, /*incarnation=*/8};
  std::unique_ptr<grpc::Server> replacement_server_;
  std::unique_ptr<v1::PeerService::Stub> replacement_stub_;
  PeerLiveness liveness_{0, 2, kTimeout};
  std::atomic<int> lost_{0};
  std::unique_ptr<PeerHeartbeat> heartbeat_;
};

TEST_F(PeerHeartbeatTest, AStallOfThisRankLosesNoPeer) {
  Start();
  AwaitPings(3);
  // One round stalls here for 1.5 s, past the peer timeout: its missing answer is not judged.
  peer_.Stall(1);
  AwaitPings(5);
  EXPECT_EQ(lost_.load(), 0);
  EXPECT_FALSE(liveness_.failed(1));
  // And again later: each stall alone is forgiven.
  peer_.Stall(1);
  AwaitPings(5);
  EXPECT_EQ(lost_.load(), 0);
  EXPECT_FALSE(liveness_.failed(1));
}

TEST_F(PeerHeartbeatTest, PingsTellWhereTheGroupKeepsItsStoreNow) {
  // A restarted peer whose configured store (rank 0's own) does not answer learns from them
  // where a stand-in for rank 0 serves it; they tell of the current one at every round.
  absl::Mutex mu;
  std::string stand_in = "127.0.0.1:4100";
  Start(nullptr, [&] {
    absl::MutexLock lock(&mu);
    return stand_in;
  });
  AwaitPings(2);
  EXPECT_EQ(peer_.rendezvous(), "127.0.0.1:4100");
  {
    absl::MutexLock lock(&mu);
    stand_in.clear();  // rank 0's own process is back
  }
  AwaitPings(2);
  EXPECT_EQ(peer_.rendezvous(), "");
}

// Every ping tells whether this rank knows that its group formed: rank 0 reports SERVING once
// every other rank told it so (a ping of a rank that was answered so too late, or a probe's,
// does not count).
TEST_F(PeerHeartbeatTest, PingsTellWhetherThisRankKnowsTheGroupFormed) {
  std::atomic<bool> formed{false};
  Start(nullptr, nullptr, [&] { return formed.load(); });
  AwaitPings(2);
  EXPECT_FALSE(peer_.knows_group_formed());
  formed = true;
  AwaitPings(2);
  EXPECT_TRUE(peer_.knows_group_formed());
}

TEST_F(PeerHeartbeatTest, APeerThatStopsAnsweringIsLost) {
  Start();
  AwaitPings(3);
  peer_.GoSilent();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (lost_.load() == 0 && absl::Now() < deadline) absl::SleepFor(kInterval);
  EXPECT_EQ(lost_.load(), 1);
  EXPECT_TRUE(liveness_.failed(1));
}

TEST_F(PeerHeartbeatTest, StallsInARowAreJudged) {
  Start();
  AwaitPings(3);
  // Every round stalls: the first is forgiven, the next one judged (a rank always this slow
  // still loses a peer that does not answer).
  peer_.Stall(2);
  AwaitPings(2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (lost_.load() == 0 && absl::Now() < deadline) absl::SleepFor(kInterval);
  EXPECT_EQ(lost_.load(), 1);
}

TEST_F(PeerHeartbeatTest, APingToTheProcessARejoinReplacedIsNotCounted) {
  // Rank 1 (a stand-in, incarnation 7) is replaced by its own process (incarnation 8) in a heal
  // that begins right after a round chose rank 1's stub: that round's ping still reaches the
  // stand-in. Its answer must not count as the rank's new process, whose next answers would then
  // look like yet another process (the rank lost at once).
  replacement_server_ = Serve(&replacement_, &replacement_stub_);
  ASSERT_NE(replacement_server_, nullptr);
  std::atomic<int> rounds{0};
  Start([&](int) -> v1::PeerService::Stub* {
    const int round = ++rounds;
    if (round < 3) return stub_.get();
    if (round == 3) {
      liveness_.Rejoined(1, absl::Now());  // the heal's first phase, just after the choice
      return stub_.get();
    }
    return replacement_stub_.get();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (replacement_.pings() < 5 && absl::Now() < deadline) absl::SleepFor(kInterval / 5);
  ASSERT_GE(replacement_.pings(), 5);
  EXPECT_EQ(lost_.load(), 0);
  EXPECT_FALSE(liveness_.failed(1));
}

}  // namespace
}  // namespace optstep
