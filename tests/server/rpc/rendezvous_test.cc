// GrpcKeyValueStore against a real RendezvousService on loopback: what Gloo's store and the
// ranks' addresses go through.

#include "server/rpc/rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// Rank 0's side: the service on 127.0.0.1:`port` (0: any free port).
struct Rendezvous {
  explicit Rendezvous(int port = 0) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &this->port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Rendezvous() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string target() const { return absl::StrCat("127.0.0.1:", port); }

  RendezvousServiceImpl service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// A loopback port nothing listens on now.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(GrpcKeyValueStoreTest, WhatOneRankSetsAnotherGets) {
  Rendezvous rank0;
  ASSERT_NE(rank0.port, 0);
  GrpcKeyValueStore writer(rank0.target()), reader(rank0.target());
  const std::string binary("\0\x01\xff gloo", 8);
  ASSERT_THAT(writer.Set(RankAddressKey(3), "10.0.0.3:50051"), IsOk());
  ASSERT_THAT(writer.Set("nccl/id", binary), IsOk());
  EXPECT_EQ(RankAddressKey(3), "optstep/rank/3/address");
  auto address = reader.Get(RankAddressKey(3), absl::Seconds(5));
  ASSERT_THAT(address.status(), IsOk());
  EXPECT_EQ(*address, "10.0.0.3:50051");
  auto id = reader.Get("nccl/id", absl::Seconds(5));
  ASSERT_THAT(id.status(), IsOk());
  EXPECT_EQ(*id, binary);  // bytes, not text
}

TEST(GrpcKeyValueStoreTest, GetWaitsForALaterSetAndTimesOutOtherwise) {
  Rendezvous rank0;
  GrpcKeyValueStore store(rank0.target());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_THAT(GrpcKeyValueStore(rank0.target()).Set("late", "here"), IsOk());
  });
  auto value = store.Get("late", absl::Seconds(10));
  late.join();
  ASSERT_THAT(value.status(), IsOk());
  EXPECT_EQ(*value, "here");
  const absl::Time start = absl::Now();
  EXPECT_THAT(store.Get("never", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "key 'never' was not set within"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Ranks may start before rank 0 listens: calls wait for it (up to their deadline).
TEST(GrpcKeyValueStoreTest, CallsWaitForRankZeroToListen) {
  const int port = UnusedPort();
  GrpcKeyValueStore store(absl::StrCat("127.0.0.1:", port));
  absl::Notification started;
  std::unique_ptr<Rendezvous> rank0;
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(500));
    rank0 = std::make_unique<Rendezvous>(port);
    started.Notify();
  });
  EXPECT_THAT(store.Set("early", "bird"), IsOk());
  later.join();
  ASSERT_TRUE(started.HasBeenNotified());
  ASSERT_EQ(rank0->port, port);
  auto value = store.Get("early", absl::Seconds(5));
  ASSERT_THAT(value.status(), IsOk());
  EXPECT_EQ(*value, "bird");
}

}  // namespace
}  // namespace optstep
