// Gloo collectives between two ranks against raw TCP on loopback, in the same run.
//
//   bazel run -c opt //bench:comm_bench
//   bazel run -c opt //bench:comm_bench -- --benchmark_filter=AllGatherV
//   bazel run -c opt //bench:comm_bench -- --benchmark_repetitions=3  (on a busy machine)
//
// Two ranks are two threads of this process, each with its own GlooCommunicator (its own TCP
// device on 127.0.0.1); the benchmark thread is rank 0 and times its calls, a helper thread
// runs rank 1's matching calls.
//
//   BM_RawTcp/<bytes>          rank 0 writes <bytes> into one loopback TCP connection, rank 1
//                              reads them and answers one byte. GB/s = bytes / time.
//   BM_RawTcpExchange/<bytes>  both ranks send <bytes> to each other at once over that
//                              connection (one thread each, poll), as the ranks of a two-rank
//                              ring do. GB/s = bytes / time, per direction: the yardstick of
//                              the ratios.
//   BM_GlooAllGatherV/<bytes>  each rank contributes bytes / 2 (in place); every rank ends with
//                              <bytes>. GB/s = bytes / time (algorithm bandwidth); each rank
//                              sends bytes / 2, so bus_GB/s = GB/s * (n - 1) / n.
//   BM_GlooAllReduce/<bytes>   float32 sum of <bytes> (ring: reduce-scatter + all-gather).
//                              GB/s = bytes / time; each rank sends bytes * 2 (n - 1) / n, so
//                              bus_GB/s = GB/s * 2 (n - 1) / n.
//   ratio = bus_GB/s / exchange GB/s at the same size: the bytes a rank sends per second in
//   the collective against what it sends per second over a bare connection carrying traffic
//   both ways.
//
// Loopback shares the CPU between the sender, the receiver and the kernel's copies, so these
// figures bound what Gloo adds on top of TCP rather than what a network would give.
// At the end the binary prints a table of the same figures by size, from the best run of each
// benchmark (other load on the machine only slows a run down).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/key_value_store.h"

namespace optstep {
namespace {

constexpr int kRanks = 2;
// Bytes each rank sends per byte of the buffer: all-gather (n - 1) / n, ring all-reduce
// 2 (n - 1) / n.
constexpr double kGatherBusFactor = (kRanks - 1.0) / kRanks;
constexpr double kReduceBusFactor = 2.0 * (kRanks - 1.0) / kRanks;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "comm_bench: %s\n", what.c_str());
  std::abort();
}

void CheckOk(const absl::Status& status) {
  if (!status.ok()) Die(status.ToString());
}

constexpr int64_t kMiB = int64_t{1} << 20;

// Best GB/s by size and benchmark ("raw", "exchange", "gather", "reduce") over the runs so far
// (with --benchmark_repetitions, the best repetition: the machine's other load only slows a
// run down). BM_RawTcp and BM_RawTcpExchange are registered, hence run, first.
std::map<int64_t, std::map<std::string, double>>& Results() {
  static auto* results = new std::map<int64_t, std::map<std::string, double>>();
  return *results;
}

// The two ranks' communicators, created once.
std::vector<std::unique_ptr<Communicator>>& GlooRanks() {
  static auto* ranks = [] {
    auto* comms = new std::vector<std::unique_ptr<Communicator>>(kRanks);
    std::shared_ptr<KeyValueStore> store = NewInMemoryKeyValueStore();
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kRanks; ++rank) {
      threads.emplace_back([&, rank] {
        CommunicatorOptions options;
        options.kind = "gloo";
        options.rank = rank;
        options.world_size = kRanks;
        options.prefix = "comm_bench";
        options.store = store;
        options.hostname = "127.0.0.1";
        options.timeout = absl::Seconds(120);
        absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateCommunicator(options);
        CheckOk(comm.status());
        (*comms)[rank] = *std::move(comm);
      });
    }
    for (std::thread& thread : threads) thread.join();
    return comms;
  }();
  return *ranks;
}

// One loopback TCP connection: fds[0] is rank 0's end, fds[1] rank 1's.
struct TcpConnection {
  int fds[2];
};

TcpConnection& Tcp() {
  static TcpConnection* connection = [] {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      Die("cannot listen on 127.0.0.1");
    }
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0 || connect(client, reinterpret_cast<sockaddr*>(&address), length) != 0) {
      Die("cannot connect to 127.0.0.1");
    }
    const int server = accept(listener, nullptr, nullptr);
    if (server < 0) Die("cannot accept");
    close(listener);
    return new TcpConnection{{client, server}};
  }();
  return *connection;
}

void SendAll(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = send(fd, data, bytes, 0);
    if (n <= 0) Die("send failed");
    data += n;
    bytes -= static_cast<size_t>(n);
  }
}

void RecvAll(int fd, char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = recv(fd, data, bytes, 0);
    if (n <= 0) Die("recv failed");
    data += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Sends `bytes` from `out` and receives `bytes` into `in` over `fd` at the same time (one
// thread, poll): what each rank of a two-rank ring does.
void Exchange(int fd, const char* out, char* in, size_t bytes) {
  size_t sent = 0;
  size_t received = 0;
  while (sent < bytes || received < bytes) {
    pollfd p{fd, static_cast<short>((sent < bytes ? POLLOUT : 0) | (received < bytes ? POLLIN : 0)),
             0};
    if (poll(&p, 1, -1) < 0) Die("poll failed");
    if ((p.revents & (POLLERR | POLLHUP)) != 0) Die("connection failed");
    if ((p.revents & POLLOUT) != 0) {
      const ssize_t n = send(fd, out + sent, bytes - sent, MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN) Die("send failed");
      if (n > 0) sent += static_cast<size_t>(n);
    }
    if ((p.revents & POLLIN) != 0) {
      const ssize_t n = recv(fd, in + received, bytes - received, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) Die("recv failed");
      if (n > 0) received += static_cast<size_t>(n);
    }
  }
}

// Times `rank0` for each iteration while a helper thread runs `rank1` as many times.
// Answers the total seconds.
template <typename Rank0, typename Rank1>
double RunPair(benchmark::State& state, Rank0 rank0, Rank1 rank1) {
  const int64_t iterations = state.max_iterations;
  std::thread peer([&] {
    for (int64_t i = 0; i < iterations; ++i) rank1();
  });
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    rank0();
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  peer.join();
  return total;
}

// Records `gbps` as a figure of `name` at this size; answers the best so far.
double Record(benchmark::State& state, const std::string& name, double gbps) {
  double& best = Results()[state.range(0)][name];
  best = std::max(best, gbps);
  return best;
}

// Sets the counters of a collective named `name` whose ranks each send `bus_factor` * bytes.
void Report(benchmark::State& state, const std::string& name, double seconds, double bus_factor) {
  const double gbps = static_cast<double>(state.range(0)) * state.iterations() / seconds / 1e9;
  Record(state, name, gbps);
  state.counters["GB/s"] = gbps;
  state.counters["bus_GB/s"] = gbps * bus_factor;
  const double exchange = Results()[state.range(0)]["exchange"];
  if (exchange > 0) state.counters["ratio"] = gbps * bus_factor / exchange;
}

void BM_RawTcp(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  TcpConnection& tcp = Tcp();
  std::vector<char> out(bytes, 1), in(bytes, 0);
  char ack = 0;
  const double seconds = RunPair(
      state,
      [&] {
        SendAll(tcp.fds[0], out.data(), bytes);
        RecvAll(tcp.fds[0], &ack, 1);
      },
      [&] {
        RecvAll(tcp.fds[1], in.data(), bytes);
        SendAll(tcp.fds[1], &ack, 1);
      });
  const double gbps = static_cast<double>(bytes) * state.iterations() / seconds / 1e9;
  Record(state, "raw", gbps);
  state.counters["GB/s"] = gbps;
}

void BM_RawTcpExchange(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  TcpConnection& tcp = Tcp();
  std::vector<std::vector<char>> out(kRanks, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> in(kRanks, std::vector<char>(bytes, 0));
  const double seconds = RunPair(
      state, [&] { Exchange(tcp.fds[0], out[0].data(), in[0].data(), bytes); },
      [&] { Exchange(tcp.fds[1], out[1].data(), in[1].data(), bytes); });
  const double gbps = static_cast<double>(bytes) * state.iterations() / seconds / 1e9;
  Record(state, "exchange", gbps);
  state.counters["GB/s"] = gbps;
}

void BM_GlooAllGatherV(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<std::unique_ptr<Communicator>>& ranks = GlooRanks();
  const std::vector<int64_t> counts(kRanks, bytes / kRanks);
  std::vector<std::vector<uint8_t>> buffers(kRanks, std::vector<uint8_t>(bytes, 7));
  auto gather = [&](int rank) {
    const uint8_t* own = buffers[rank].data() + rank * counts[0];
    CheckOk(ranks[rank]->AllGatherV(own, counts[rank], buffers[rank].data(), counts,
                                    CommDType::kUint8));
  };
  const double seconds = RunPair(
      state, [&] { gather(0); }, [&] { gather(1); });
  Report(state, "gather", seconds, kGatherBusFactor);
}

void BM_GlooAllReduce(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  std::vector<std::unique_ptr<Communicator>>& ranks = GlooRanks();
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(bytes / 4, 0.0f));
  auto reduce = [&](int rank) {
    CheckOk(ranks[rank]->AllReduce(buffers[rank].data(), bytes / 4, CommDType::kFloat32,
                                   ReduceOp::kSum));
  };
  const double seconds = RunPair(
      state, [&] { reduce(0); }, [&] { reduce(1); });
  Report(state, "reduce", seconds, kReduceBusFactor);
}

// Registration order is run order: raw TCP first, so that the collectives can report ratios.
BENCHMARK(BM_RawTcp)
    ->RangeMultiplier(4)
    ->Range(kMiB, 256 * kMiB)
    ->ArgName("bytes")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RawTcpExchange)
    ->RangeMultiplier(4)
    ->Range(kMiB, 256 * kMiB)
    ->ArgName("bytes")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GlooAllGatherV)
    ->RangeMultiplier(4)
    ->Range(kMiB, 256 * kMiB)
    ->ArgName("bytes")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GlooAllReduce)
    ->RangeMultiplier(4)
    ->Range(kMiB, 256 * kMiB)
    ->ArgName("bytes")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void PrintSummary() {
  std::printf(
      "\nSummary (%d ranks on loopback, best run of each; GB/s = bytes / time; bus = bytes a "
      "rank sends / time; ratio = bus / exchange)\n",
      kRanks);
  std::printf("%6s %9s %9s | %-26s | %-26s\n", "", "raw TCP", "exchange", "      all-gather-v",
              "       all-reduce");
  std::printf("%6s %9s %9s | %8s %8s %8s | %8s %8s %8s\n", "MiB", "GB/s", "GB/s", "GB/s", "bus",
              "ratio", "GB/s", "bus", "ratio");
  for (const auto& [bytes, row] : Results()) {
    // C++17 cannot capture a structured binding itself, only a reference initialised from it.
    auto get = [&row = row](const char* key) {
      auto it = row.find(key);
      return it == row.end() ? 0.0 : it->second;
    };
    const double exchange = get("exchange");
    auto ratio = [exchange](double bus) { return exchange > 0 ? bus / exchange : 0.0; };
    const double gather_bus = get("gather") * kGatherBusFactor;
    const double reduce_bus = get("reduce") * kReduceBusFactor;
    std::printf("%6lld %9.2f %9.2f | %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f\n",
                static_cast<long long>(bytes / kMiB), get("raw"), exchange, get("gather"),
                gather_bus, ratio(gather_bus), get("reduce"), reduce_bus, ratio(reduce_bus));
  }
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  optstep::PrintSummary();
  benchmark::Shutdown();
  return 0;
}
