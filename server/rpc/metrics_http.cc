#include "server/rpc/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstep {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

std::string Response(const char* status, const char* type, const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host,
                                                                            int port, Body body) {
  const std::string address = absl::StrCat(host, ":", port);
  // The pipe that wakes Serve() for the destructor: without it the server could not be stopped.
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": pipe2: ", std::strerror(errno)));
  }
  auto close_wake = [&wake] {
    close(wake[0]);
    close(wake[1]);
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int error =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (error != 0) {
    close_wake();
    return absl::UnavailableError(
        absl::StrCat("metrics address ", address, ": ", gai_strerror(error)));
  }
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    close_wake();
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ", why));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, wake, bound_port, std::move(body)));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, const int wake[2], int port, Body body)
    : listen_fd_(listen_fd), wake_{wake[0], wake[1]}, port_(port), body_(std::move(body)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const char byte = 0;
  (void)!write(wake_[1], &byte, 1);
  thread_.join();
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void MetricsHttpServer::Serve() {
  std::vector<Connection> open;
  std::vector<pollfd> fds;
  // Closes open[i]; the last connection takes its place.
  auto drop = [&open](size_t i) {
    close(open[i].fd);
    open[i] = std::move(open.back());
    open.pop_back();
  };
  // Set when accept() ran out of descriptors or memory: the listening socket stays readable, so
  // polling it again at once would spin; it is left alone until then.
  absl::Time accept_resumes = absl::InfinitePast();
  while (true) {
    // Connections past their deadline are closed before anything else is polled.
    const absl::Time now = absl::Now();
    absl::Time next_deadline = absl::InfiniteFuture();
    const bool accepting = open.size() < kMaxConnections && accept_resumes <= now;
    if (accept_resumes > now) next_deadline = accept_resumes;
    for (size_t i = 0; i < open.size();) {
      if (open[i].deadline <= now) {
        drop(i);
        continue;
      }
      next_deadline = std::min(next_deadline, open[i].deadline);
      ++i;
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    // At the cap, or backing off, the listening socket is left alone: new clients wait in its
    // backlog.
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    for (const Connection& c : open) {
      fds.push_back({c.fd, static_cast<short>(c.answer.empty() ? POLLIN : POLLOUT), 0});
    }
    const int timeout_ms = next_deadline == absl::InfiniteFuture()
                               ? -1
                               : static_cast<int>(absl::ToInt64Milliseconds(
                                     absl::Ceil(next_deadline - now, absl::Milliseconds(1))));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) break;  // the destructor's byte
    // Backwards: a drop moves an already visited connection into i, and fds[2 + j] stays
    // open[j]'s for every j < i.
    for (size_t i = open.size(); i-- > 0;) {
      if (fds[i + 2].revents != 0 && !Progress(open[i])) drop(i);
    }
    if (fds[1].revents != 0 && !AcceptAll(open)) accept_resumes = absl::Now() + kAcceptBackoff;
  }
  for (const Connection& c : open) close(c.fd);
}

bool MetricsHttpServer::AcceptAll(std::vector<Connection>& open) {
  while (open.size() < kMaxConnections) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EAGAIN: none left. Out of descriptors or memory: the client stays in the backlog.
      return !(errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM);
    }
    Connection connection;
    connection.fd = fd;
    connection.deadline = absl::Now() + kRequestDeadline;
    open.push_back(std::move(connection));
  }
  return true;
}

bool MetricsHttpServer::Progress(Connection& c) {
  if (c.answer.empty()) {
    // Reads the request head (a scraper sends a few hundred bytes), bounded in size.
    char buffer[1024];
    const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false;
    c.request.append(buffer, static_cast<size_t>(n));
    if (c.request.size() < kMaxRequestBytes && !absl::StrContains(c.request, "\r\n\r\n")) {
      return true;
    }
    c.answer = Answer(c.request);
  }
  const ssize_t n =
      send(c.fd, c.answer.data() + c.written, c.answer.size() - c.written, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c.written += static_cast<size_t>(n);
  return c.written < c.answer.size();
}

std::string MetricsHttpServer::Answer(const std::string& request) const {
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    return Response("200 OK", "text/plain; version=0.0.4", body_());
  }
  if (absl::StartsWith(request, "GET ")) {
    return Response("404 Not Found", "text/plain", "only /metrics is served\n");
  }
  return Response("405 Method Not Allowed", "text/plain", "only GET is served\n");
}

}  // namespace optstep
