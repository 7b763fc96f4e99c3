// Gradient ingest through one Step stream on loopback, against raw TCP loopback throughput
// measured in the same run (a plain socket sender and receiver), for 1 and 4 connections.
//
//   bazel run -c opt //bench:transport_bench -- --megabytes=256
//
// The server (engine, CPU device, gRPC services) runs in this process on 127.0.0.1:0; each
// trainer is an optstep::Client with its own channel, sending fp32 gradients of one parameter
// (SHARDED: trainer t sends the t-th quarter) and asking for no parameters back. Two figures:
// "wall" is the trainers' whole Step call (ingest + the step itself: SGD, one pass over the
// parameter); "ingest" is the server's ingest phase (StepObserver: first step header -> every
// chunk copied into the gradient buffer and committed), the transport's own throughput.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/in_process_ranks.h"
#include "bench/phase_recorder.h"
#include "client/cpp/client.h"
#include "server/engine/engine.h"

ABSL_FLAG(int, megabytes, 256, "Gradient bytes per step (all connections together), MiB.");
ABSL_FLAG(int, repeats, 3, "Measured repetitions; the best is reported.");
ABSL_FLAG(std::vector<std::string>, connections, std::vector<std::string>({"1", "4"}),
          "Numbers of connections (trainers) to measure.");
ABSL_FLAG(bool, tcp, true, "Also measure raw TCP (the reference).");
ABSL_FLAG(int, stream_window_bytes, 16 << 20,
          "The rank's HTTP/2 window for each stream it receives (--stream_window_bytes).");

namespace optstep {
namespace {

// Sends `bytes` over `connections` TCP sockets on loopback (each its share) and answers GB/s.
double RawTcp(size_t bytes, int connections) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, connections);
  const size_t share = bytes / connections;
  std::vector<std::thread> receivers;
  const absl::Time start = absl::Now();
  for (int c = 0; c < connections; ++c) {
    receivers.emplace_back([listener, share] {
      int fd = accept(listener, nullptr, nullptr);
      std::vector<char> buffer(4 << 20);
      size_t got = 0;
      while (got < share) {
        ssize_t n = read(fd, buffer.data(), buffer.size());
        if (n <= 0) break;
        got += n;
      }
      close(fd);
    });
  }
  std::vector<std::thread> senders;
  for (int c = 0; c < connections; ++c) {
    senders.emplace_back([addr, share] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
      std::vector<char> buffer(4 << 20, 1);
      size_t sent = 0;
      while (sent < share) {
        ssize_t n = write(fd, buffer.data(), std::min(buffer.size(), share - sent));
        if (n <= 0) break;
        sent += n;
      }
      close(fd);
    });
  }
  for (auto& t : senders) t.join();
  for (auto& t : receivers) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  close(listener);
  return bytes / seconds / 1e9;
}

int Run() {
  const size_t total = static_cast<size_t>(absl::GetFlag(FLAGS_megabytes)) << 20;
  const uint64_t numel = total / sizeof(float);

  auto recorder = std::make_shared<bench::PhaseRecorder>();
  bench::InProcessRankOptions rank_options;
  rank_options.observer = recorder;
  rank_options.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  auto ranks = bench::StartInProcessRanks(rank_options, nullptr);
  if (!ranks.ok()) return 1;
  const std::string target = (*ranks)[0].address;

  std::vector<float> gradient(numel, 1e-3f);
  std::printf("%-12s %10s %12s %12s %12s %12s   (%d MiB per step; best of %d)\n", "connections",
              "wall GB/s", "ingest GB/s", "raw TCP GB/s", "wall ratio", "ingest ratio",
              absl::GetFlag(FLAGS_megabytes), absl::GetFlag(FLAGS_repeats));
  for (const std::string& flag : absl::GetFlag(FLAGS_connections)) {
    int connections = 1;
    if (!absl::SimpleAtoi(flag, &connections) || connections < 1) return 1;
    ClientOptions options;
    options.target = target;
    auto admin = Client::Connect(options);
    v1::SessionSpec spec;
    auto* p = spec.add_parameters();
    p->set_name("w");
    p->add_shape(numel);
    spec.set_num_trainers(connections);
    spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
    auto* sgd = spec.mutable_optimizer()->add_sub_optimizers();
    sgd->set_name("sgd");
    sgd->set_kind("sgd");
    spec.mutable_optimizer()->set_clip_grad(0);
    auto session = (*admin)->CreateSession(spec);
    if (!session.ok()) {
      std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
      return 1;
    }
    std::vector<std::unique_ptr<Client>> trainers;
    for (int t = 0; t < connections; ++t) trainers.push_back(*Client::Connect(options));
    double best = 0.0, best_ingest = 0.0;
    for (int step = 1; step <= absl::GetFlag(FLAGS_repeats) + 1; ++step) {
      const absl::Time start = absl::Now();
      std::vector<std::thread> threads;
      for (int t = 0; t < connections; ++t) {
        threads.emplace_back([&, t] {
          const uint64_t begin = numel * t / connections, end = numel * (t + 1) / connections;
          GradientSlice slice;
          slice.offset = begin;
          slice.bytes = absl::Span<const uint8_t>(
              reinterpret_cast<const uint8_t*>(gradient.data() + begin), (end - begin) * 4);
          StepOptions o;
          o.session_id = session->session_id();
          o.step = step;
          o.trainer_id = t;
          o.skip_return = true;
          auto reply = trainers[t]->Step(o, absl::MakeConstSpan(&slice, 1));
          if (!reply.ok()) std::fprintf(stderr, "%s\n", reply.status().ToString().c_str());
        });
      }
      for (auto& thread : threads) thread.join();
      const double gbps = total / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
      const absl::Duration ingest =
          recorder->Take()[static_cast<int>(StepObserver::Phase::kIngest)];
      if (step == 1) continue;  // the first step warms up
      best = std::max(best, gbps);
      best_ingest = std::max(best_ingest, total / absl::ToDoubleSeconds(ingest) / 1e9);
    }
    double tcp = 0.0;
    for (int r = 0; absl::GetFlag(FLAGS_tcp) && r < absl::GetFlag(FLAGS_repeats); ++r) {
      tcp = std::max(tcp, RawTcp(total, connections));
    }
    std::printf("%-12d %10.3f %12.3f %12.3f %12.3f %12.3f\n", connections, best, best_ingest, tcp,
                best / tcp, best_ingest / tcp);
    (void)(*admin)->CloseSession(session->session_id());
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("peak RSS %.0f MiB (server + clients in one process; the session holds %.0f MiB "
              "of masters and gradients)\n",
              usage.ru_maxrss / 1024.0, 2.0 * total / (1 << 20));
  (*ranks)[0].server->Shutdown(absl::Now() + absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstep::Run();
}
