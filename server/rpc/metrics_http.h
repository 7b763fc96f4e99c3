#ifndef OPTSTEP_SERVER_RPC_METRICS_HTTP_H_
#define OPTSTEP_SERVER_RPC_METRICS_HTTP_H_

// A minimal HTTP/1.0 endpoint that answers GET /metrics with a text body (the Prometheus
// exposition format). One thread, one request per connection: a scrape every few seconds needs
// no more.
//
// Why not prometheus::Exposer: its civetweb threads run with small stacks, and a process that
// also loads libquadmath (OpenBLAS pulls it in) sends glibc's printf down a path that overflows
// them at the first thread start.

#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace optstep {

class MetricsHttpServer {
 public:
  using Body = std::function<std::string()>;

  // Binds host:port (port 0: any free port) and serves `body` until destroyed.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, int port,
                                                                  Body body);
  // Stops accepting, finishes the request in progress and joins the thread.
  ~MetricsHttpServer();

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int port, Body body);
  void Serve();
  void Answer(int fd);

  const int listen_fd_;
  const int port_;
  const Body body_;
  int wake_[2] = {-1, -1};  // a byte here ends Serve()
  std::thread thread_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_METRICS_HTTP_H_
