// The metrics endpoint's HTTP server under clients that do not behave: silent connections and a
// reader that never reads hold only their own connection, so a scrape still answers at once, and
// every connection is closed by its deadline.

#include "server/rpc/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void SendGet(int fd, const std::string& path) {
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
}

// Reads until the server closes; "" when nothing came within `limit`.
std::string ReadAll(int fd, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  std::string response;
  char buffer[65536];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd readable = {fd, POLLIN, 0};
    if (left <= 0 || poll(&readable, 1, static_cast<int>(left)) <= 0) return response;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return response;
    response.append(buffer, static_cast<size_t>(n));
  }
}

std::string Scrape(int port, const std::string& path, absl::Duration limit) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendGet(fd, path);
  std::string response = ReadAll(fd, limit);
  close(fd);
  return response;
}

TEST(MetricsHttpServerTest, AnswersMetricsAndRefusesTheRest) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server,
                               MetricsHttpServer::Start("127.0.0.1", 0, [] { return "up 1\n"; }));
  const std::string metrics = Scrape(server->port(), "/metrics", absl::Seconds(5));
  EXPECT_THAT(metrics, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_THAT(metrics, HasSubstr("\r\n\r\nup 1\n"));
  EXPECT_THAT(Scrape(server->port(), "/other", absl::Seconds(5)), StartsWith("HTTP/1.0 404"));
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  const std::string post = "POST /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(fd, post.data(), post.size(), MSG_NOSIGNAL), static_cast<ssize_t>(post.size()));
  EXPECT_THAT(ReadAll(fd, absl::Seconds(5)), StartsWith("HTTP/1.0 405"));
  close(fd);
}

TEST(MetricsHttpServerTest, SilentAndStalledClientsDoNotBlockAScrape) {
  // A body larger than the socket buffers, so that a client that asks and never reads stalls
  // its answer's write.
  const std::string big(16 << 20, 'x');
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server,
                               MetricsHttpServer::Start("127.0.0.1", 0, [&big] { return big; }));
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    const int fd = Connect(port);  // connects and says nothing
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const int stalled = Connect(port);
  ASSERT_GE(stalled, 0);
  SendGet(stalled, "/metrics");  // and never reads

  // Each of them used to hold the only serving thread for up to 2 s (the stalled one forever).
  const absl::Time start = absl::Now();
  const std::string answer = Scrape(port, "/metrics", absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(answer, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_EQ(answer.size() - answer.find("\r\n\r\n") - 4, big.size());
  EXPECT_LT(took, absl::Seconds(1)) << "a scrape waited behind idle connections";

  // Every misbehaving connection is closed by the server at its deadline.
  for (int fd : idle) {
    pollfd readable = {fd, POLLIN, 0};
    const int limit_ms =
        static_cast<int>(absl::ToInt64Milliseconds(MetricsHttpServer::kRequestDeadline)) + 3000;
    ASSERT_EQ(poll(&readable, 1, limit_ms), 1) << "an idle connection outlived its deadline";
    char byte;
    EXPECT_LE(recv(fd, &byte, 1, 0), 0);  // closed, nothing sent
    close(fd);
  }
  const std::string partial = ReadAll(stalled, absl::Seconds(5));
  EXPECT_LT(partial.size(), big.size()) << "the stalled answer was not cut at its deadline";
  close(stalled);
}

// Lowers the soft limit on open descriptors so that only `spare` more can be opened, and
// restores it when destroyed.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(int spare) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    const int lowest_free = dup(0);  // descriptors are handed out lowest first
    close(lowest_free);
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(lowest_free + spare);
    setrlimit(RLIMIT_NOFILE, &lowered);
  }
  ~DescriptorLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

absl::Duration ProcessCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) + absl::DurationFromTimeval(usage.ru_stime);
}

TEST(MetricsHttpServerTest, OutOfDescriptorsPausesAcceptingInsteadOfSpinning) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server,
                               MetricsHttpServer::Start("127.0.0.1", 0, [] { return "up 1\n"; }));
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  SendGet(fd, "/metrics");
  std::string answer;
  {
    // The server cannot accept the client: its listening socket stays readable. Polling it again
    // at once used to spin a core for as long as the descriptors were short.
    DescriptorLimit none(0);
    const absl::Duration cpu_before = ProcessCpuTime();
    absl::SleepFor(absl::Milliseconds(600));
    const absl::Duration spent = ProcessCpuTime() - cpu_before;
    EXPECT_LT(spent, absl::Milliseconds(150)) << "the server spun while out of descriptors";
  }
  // Descriptors again: the client waiting in the backlog is served.
  EXPECT_THAT(ReadAll(fd, absl::Seconds(5)), StartsWith("HTTP/1.0 200 OK\r\n"));
  close(fd);
}

TEST(MetricsHttpServerTest, StartFailsCleanlyWithoutDescriptorsForItsWakePipe) {
  // One spare descriptor: enough for the listening socket, not for the pipe that stops the
  // server. A server without it could never be stopped (its destructor waited forever).
  absl::Status started;
  {
    DescriptorLimit one(1);
    started = MetricsHttpServer::Start("127.0.0.1", 0, [] { return ""; }).status();
  }
  EXPECT_THAT(started, testutil::StatusIs(absl::StatusCode::kUnavailable, "pipe2"));
}

}  // namespace
}  // namespace optstep
