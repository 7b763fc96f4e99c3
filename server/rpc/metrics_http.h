#ifndef OPTSTEP_SERVER_RPC_METRICS_HTTP_H_
#define OPTSTEP_SERVER_RPC_METRICS_HTTP_H_

// A minimal HTTP/1.0 endpoint that answers GET /metrics with a text body (the Prometheus
// exposition format), one request per connection.
//
// One thread serves every connection at once with non-blocking sockets and poll(): a client
// that connects and sends nothing, or asks and never reads, holds only its own connection, and
// only until its deadline (kRequestDeadline from accept to the last byte written). At most
// kMaxConnections are open at a time; further ones wait in the listen backlog until one ends.
// `body` runs on that thread, one call at a time.
//
// Why not prometheus::Exposer: its civetweb threads run with small stacks, and a process that
// also loads libquadmath (OpenBLAS pulls it in) sends glibc's printf down a path that overflows
// them at the first thread start.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace optstep {

class MetricsHttpServer {
 public:
  using Body = std::function<std::string()>;

  // The time a connection may take from accept to its answer's last byte; closed beyond it.
  static constexpr absl::Duration kRequestDeadline = absl::Seconds(2);
  // Connections served at once.
  static constexpr size_t kMaxConnections = 64;
  // How long accepting pauses when the process is out of descriptors (EMFILE) or memory.
  static constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);

  // Binds host:port (port 0: any free port) and serves `body` until destroyed.
  // UNAVAILABLE naming the address when it cannot be bound (or the process is out of
  // descriptors).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  Body body);
  // Stops accepting, closes the open connections and joins the thread.
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  // One accepted connection: the request read so far, then the answer being written.
  struct Connection {
    int fd = -1;
    absl::Time deadline;
    std::string request;
    std::string answer;  // empty while the request is read
    size_t written = 0;
  };

  MetricsHttpServer(int listen_fd, const int wake[2], int port, Body body);
  void Serve();
  // Accepts waiting clients up to kMaxConnections; false when accept ran out of descriptors or
  // memory (Serve() then pauses accepting for kAcceptBackoff).
  bool AcceptAll(std::vector<Connection>& open);
  // Reads or writes what the socket takes now; false when the connection is done.
  bool Progress(Connection& connection);
  std::string Answer(const std::string& request) const;

  const int listen_fd_;
  const int wake_[2];  // a byte written to wake_[1] ends Serve()
  const int port_;
  const Body body_;
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_METRICS_HTTP_H_
