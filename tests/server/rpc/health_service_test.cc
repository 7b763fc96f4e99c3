// HealthService on a real gRPC server on loopback, asked through a real channel: what Kubernetes'
// probes, the clients and `optstep health` see. Every call has a deadline, so that a bug fails a
// test rather than hangs it; a Watch read blocks until its message comes, so nothing sleeps.

#include "server/rpc/health_service.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/rpc/peer_host.h"

namespace optstep {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ServingStatus = HealthCheckResponse::ServingStatus;
using ::testing::HasSubstr;

constexpr char kLiveness[] = "optstep.liveness";
constexpr ServingStatus kServing = HealthCheckResponse::SERVING;
constexpr ServingStatus kNotServing = HealthCheckResponse::NOT_SERVING;
constexpr ServingStatus kServiceUnknown = HealthCheckResponse::SERVICE_UNKNOWN;
constexpr absl::Duration kCallTimeout = absl::Seconds(20);

// One Watch call: its reader goes before its context.
struct WatchCall {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;

  // The next status written; nullopt once the stream has ended.
  std::optional<ServingStatus> Next() {
    HealthCheckResponse response;
    if (!reader->Read(&response)) return std::nullopt;
    return response.status();
  }
  // Every status written until the stream ends, then its status.
  grpc::Status ReadToEnd(std::vector<ServingStatus>* statuses = nullptr) {
    for (std::optional<ServingStatus> next = Next(); next.has_value(); next = Next()) {
      if (statuses != nullptr) statuses->push_back(*next);
    }
    return reader->Finish();
  }
  // Cancels the call as its client; answers the status it ends with.
  grpc::Status Cancel() {
    context.TryCancel();
    return ReadToEnd();
  }
};

// `service` on 127.0.0.1, at a free port written to `port`.
std::unique_ptr<grpc::Server> StartOnLoopback(HealthService& service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(&service);
  return builder.BuildAndStart();
}

std::unique_ptr<Health::Stub> StubTo(int port, const grpc::ChannelArguments& arguments = {}) {
  return Health::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                   grpc::InsecureChannelCredentials(), arguments));
}

// A Watch(`service`) on `stub`, ended by kCallTimeout at the latest.
std::unique_ptr<WatchCall> StartWatch(Health::Stub& stub, const std::string& service = "") {
  auto call = std::make_unique<WatchCall>();
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  HealthCheckRequest request;
  request.set_service(service);
  call->reader = stub.Watch(&call->context, request);
  return call;
}

// The service, knowing "" and kLiveness, on 127.0.0.1 (a free port), and a stub to it.
class HealthServiceTest : public ::testing::Test {
 protected:
  HealthServiceTest() : service_({"", kLiveness}) {}
  void SetUp() override {
    server_ = StartOnLoopback(service_, &port_);
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
    stub_ = StubTo(port_);
  }
  // Before the service goes: a Watch a test left open is cancelled.
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  // Check(`service`): the call's status, and the serving status it answers.
  grpc::Status Check(const std::string& service, ServingStatus* status) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status result = stub_->Check(&context, request, &response);
    *status = response.status();
    return result;
  }
  // The serving status Check(`service`) answers; UNKNOWN (and a failure) if the call fails.
  ServingStatus StatusOf(const std::string& service) {
    ServingStatus status;
    grpc::Status result = Check(service, &status);
    EXPECT_TRUE(result.ok()) << service << ": " << result.error_message();
    return result.ok() ? status : HealthCheckResponse::UNKNOWN;
  }
  std::unique_ptr<WatchCall> Watch(const std::string& service) {
    return StartWatch(*stub_, service);
  }

  HealthService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, AServerJustStartedAnswersNotServing) {
  // Nothing was set yet. gRPC's default health service (grpc::EnableDefaultHealthCheckService)
  // answers SERVING for "" here, until the server sets it otherwise: this test fails on it.
  EXPECT_EQ(StatusOf(""), kNotServing);
  EXPECT_EQ(StatusOf(kLiveness), kNotServing);
  std::unique_ptr<WatchCall> watch = Watch("");
  EXPECT_EQ(watch->Next(), kNotServing);
  EXPECT_EQ(watch->Cancel().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(HealthServiceTest, CheckAnswersWhatWasSetForEachServiceApart) {
  service_.SetServingStatus("", true);
  EXPECT_EQ(StatusOf(""), kServing);
  EXPECT_EQ(StatusOf(kLiveness), kNotServing);
  service_.SetServingStatus(kLiveness, true);
  service_.SetServingStatus("", false);
  EXPECT_EQ(StatusOf(""), kNotServing);
  EXPECT_EQ(StatusOf(kLiveness), kServing);
}

TEST_F(HealthServiceTest, CheckOfAnUnknownServiceIsNotFound) {
  ServingStatus status;
  grpc::Status result = Check("no.such.service", &status);
  EXPECT_EQ(result.error_code(), grpc::StatusCode::NOT_FOUND) << result.error_message();
  EXPECT_THAT(result.error_message(), ::testing::HasSubstr("no.such.service"));
}

TEST_F(HealthServiceTest, WatchWritesTheStatusAtOnceAndAtEachChangeOfItsService) {
  service_.SetServingStatus("", true);
  std::unique_ptr<WatchCall> watch = Watch("");
  EXPECT_EQ(watch->Next(), kServing);
  // Each Set below follows the read of what came before it: no change is folded into another.
  service_.SetServingStatus("", false);
  EXPECT_EQ(watch->Next(), kNotServing);
  // Neither another service's change nor a status set again is written.
  service_.SetServingStatus(kLiveness, true);
  service_.SetServingStatus("", false);
  service_.SetServingStatus("", true);
  EXPECT_EQ(watch->Next(), kServing);
  EXPECT_EQ(watch->Cancel().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(HealthServiceTest, ChangesInQuickSuccessionEndInTheLatestAndNeverRepeatOne) {
  std::unique_ptr<WatchCall> watch = Watch("");
  EXPECT_EQ(watch->Next(), kNotServing);
  // 200 changes, back to NOT_SERVING. Some come while a write is in flight, and replace the
  // one that waits for it (or drop it, when they go back to what is in flight): how many are
  // written depends on the timing, what is written does not.
  for (int i = 0; i < 200; ++i) service_.SetServingStatus("", i % 2 == 0);
  service_.SetServingStatus("", false);  // no change
  service_.Shutdown();                   // no change either: ends the stream
  std::vector<ServingStatus> statuses;
  grpc::Status end = watch->ReadToEnd(&statuses);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_LE(statuses.size(), 200u);
  // They alternate from the first NOT_SERVING, and end NOT_SERVING as the service does.
  EXPECT_EQ(statuses.size() % 2, 0u);
  for (size_t i = 0; i < statuses.size(); ++i) {
    EXPECT_EQ(statuses[i], i % 2 == 0 ? kServing : kNotServing) << "message " << i + 2;
  }
}

TEST_F(HealthServiceTest, WatchOfAnUnknownServiceAnswersServiceUnknownAndKeepsWatching) {
  std::unique_ptr<WatchCall> watch = Watch("no.such.service");
  EXPECT_EQ(watch->Next(), kServiceUnknown);
  service_.SetServingStatus("", true);  // not its service
  // It stays open, as the protocol says, until Shutdown ends it (OK, nothing more written).
  service_.Shutdown();
  std::vector<ServingStatus> more;
  grpc::Status end = watch->ReadToEnd(&more);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_TRUE(more.empty());
}

// Health calls take no credential. Before, a Watch of any name stayed open holding its request
// (up to the message limit, 4 MiB), and any number could be open: a caller could fill the rank's
// memory. A name longer than any service's is refused; the open streams are bounded.
TEST_F(HealthServiceTest, AWatchOfANameLongerThanAnyServicesIsRefused) {
  const std::string name(5000, 'x');
  grpc::Status end = Watch(name)->ReadToEnd();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(end.error_message(), HasSubstr("has 5000 bytes; no service's has more than 256"));
  // One within the bound keeps watching, as the protocol says.
  std::unique_ptr<WatchCall> watch = Watch(std::string(256, 'x'));
  EXPECT_EQ(watch->Next(), kServiceUnknown);
  EXPECT_EQ(watch->Cancel().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(HealthServiceBoundTest, WatchStreamsBeyondTheBoundAreRefusedUntilOneEnds) {
  HealthService service({""}, absl::ZeroDuration(), /*max_watchers=*/2);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartOnLoopback(service, &port);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Health::Stub> stub = StubTo(port);
  const auto watch = [&stub] { return StartWatch(*stub); };
  std::unique_ptr<WatchCall> first = watch();
  std::unique_ptr<WatchCall> second = watch();
  EXPECT_EQ(first->Next(), kNotServing);
  EXPECT_EQ(second->Next(), kNotServing);
  grpc::Status refused = watch()->ReadToEnd();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("2 Watch streams are open on this rank"));
  EXPECT_EQ(first->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  // Its slot is free once the service forgot it (at its OnDone, soon after the cancel).
  std::unique_ptr<WatchCall> third;
  for (const absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
    third = watch();
    if (third->Next() == kNotServing) break;
    third.reset();
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_NE(third, nullptr) << "no Watch was admitted after one ended";
  EXPECT_EQ(third->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(second->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// One peer host opens at most max_watchers_per_peer Watch streams: before, one client could take
// all of them, and every load balancer's or monitor's Watch was refused until it left.
TEST(HealthServiceBoundTest, OnePeerOpensAtMostItsShareOfTheWatchStreams) {
  HealthService service({""}, absl::ZeroDuration(), /*max_watchers=*/1024,
                        /*max_watchers_per_peer=*/2);
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartOnLoopback(service, &port);
  ASSERT_NE(server, nullptr);
  // Two channels: the peer's connections count together.
  std::vector<std::unique_ptr<Health::Stub>> stubs;
  for (int i = 0; i < 2; ++i) {
    grpc::ChannelArguments separate;
    separate.SetInt("optstep.test.channel", i);  // no shared subchannel
    stubs.push_back(StubTo(port, separate));
  }
  std::unique_ptr<WatchCall> first = StartWatch(*stubs[0]);
  std::unique_ptr<WatchCall> second = StartWatch(*stubs[1]);
  EXPECT_EQ(first->Next(), kNotServing);
  EXPECT_EQ(second->Next(), kNotServing);
  grpc::Status refused = StartWatch(*stubs[0])->ReadToEnd();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("2 Watch streams from ipv4:127.0.0.1 are open on this rank already"));
  EXPECT_EQ(first->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(second->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  server->Shutdown(absl::ToChronoTime(absl::Now()));
}

TEST(HealthServiceBoundTest, ThePeerHostIsThePeerWithoutItsPort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:5"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerHost("unix:/tmp/socket"), "unix:/tmp/socket");
  EXPECT_EQ(PeerHost("ipv4:"), "ipv4:");
}

TEST_F(HealthServiceTest, CheckNamesAnUnknownServiceEscapedAndCut) {
  ServingStatus status;
  grpc::Status result = Check("a\nevent=forged " + std::string(100, 'y'), &status);
  EXPECT_EQ(result.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(result.error_message(), HasSubstr("unknown service 'a\\nevent=forged"));
  EXPECT_THAT(result.error_message(), HasSubstr("(115 bytes)"));
}

TEST_F(HealthServiceTest, TheClientsCancelEndsItsWatchAndNoOtherOne) {
  std::unique_ptr<WatchCall> cancelled = Watch("");
  std::unique_ptr<WatchCall> other = Watch("");
  EXPECT_EQ(cancelled->Next(), kNotServing);
  EXPECT_EQ(other->Next(), kNotServing);
  EXPECT_EQ(cancelled->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  // The service goes on telling the other watch, and a new one.
  service_.SetServingStatus("", true);
  EXPECT_EQ(other->Next(), kServing);
  std::unique_ptr<WatchCall> later = Watch("");
  EXPECT_EQ(later->Next(), kServing);
  EXPECT_EQ(other->Cancel().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(later->Cancel().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(HealthServiceTest, ShutdownEndsEveryWatchAndStaysNotServing) {
  service_.SetServingStatus("", true);
  std::unique_ptr<WatchCall> overall = Watch("");
  std::unique_ptr<WatchCall> liveness = Watch(kLiveness);
  EXPECT_EQ(overall->Next(), kServing);
  EXPECT_EQ(liveness->Next(), kNotServing);
  service_.Shutdown();
  // The server ended both streams itself (OK): gRPC's shutdown need not cancel them.
  std::vector<ServingStatus> statuses;
  grpc::Status end = overall->ReadToEnd(&statuses);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_THAT(statuses, ::testing::ElementsAre(kNotServing));
  statuses.clear();
  end = liveness->ReadToEnd(&statuses);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_TRUE(statuses.empty());  // NOT_SERVING already

  EXPECT_EQ(StatusOf(""), kNotServing);
  service_.SetServingStatus("", true);  // ignored from now on
  service_.SetServingStatus(kLiveness, true);
  EXPECT_EQ(StatusOf(""), kNotServing);
  EXPECT_EQ(StatusOf(kLiveness), kNotServing);
  // A Watch after Shutdown answers the status and ends at once.
  std::unique_ptr<WatchCall> late = Watch("");
  statuses.clear();
  end = late->ReadToEnd(&statuses);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_THAT(statuses, ::testing::ElementsAre(kNotServing));
  service_.Shutdown();  // idempotent
}

}  // namespace
}  // namespace optstep
