// CPU optimizer-step throughput against this machine's memory bandwidth.
//
//   bazel run -c opt //bench:kernels_bench
//   bazel run -c opt //bench:kernels_bench -- --benchmark_filter=AdamW
//
// BM_Triad measures the bandwidth with a STREAM-like triad a[i] = b[i] + s·c[i] (fp32, OpenMP,
// all cores; bench_util.h); BM_AdamW and BM_Sgd time CpuDevice steps (all cores unless the name
// says threads:1). Each step benchmark reports params/s, GB/s and `ratio`, its GB/s over the
// streaming triad's GB/s.
//
// Byte accounting: bytes that cross the memory bus, write-allocate included where it happens.
//   AdamW  28 B/param: reads g, p, m, v (16) and writes p, m, v (12). Every line it writes was
//          read just before, so there is no write-allocate traffic.
//   SGD    20 B/param: momentum on, reads g, p, b (12) and writes p, b (8); no write-allocate.
//   Triad  12 B/element: reads b, c and writes a. BM_Triad/streaming:1 writes `a` with
//          non-temporal stores, so no line of `a` is read first and 12 B is exactly its bus
//          traffic: it is the bandwidth that the ratios divide by (like with like: no
//          write-allocate on either side). BM_Triad/streaming:0 uses ordinary stores (STREAM's
//          plain loop) and is shown for reference: its GB/s counts 12 B (the STREAM convention);
//          its bus_GB/s counts 16 B, as if every line of `a` were also read first
//          (write-allocate), which some CPUs avoid for full-line writes, so the truth lies
//          between the two.
// At the end the binary prints a summary table of the same figures.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"

namespace optstep {
namespace {

constexpr double kAdamWBytesPerParam = 28;
constexpr double kSgdBytesPerParam = 20;

using bench::Clock;
using bench::Seconds;

void BM_Triad(benchmark::State& state) { bench::TriadBenchmark(state); }

std::unique_ptr<CpuDevice> MakeDevice(int num_threads) {
  CpuDevice::Options options;
  options.num_threads = num_threads;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    std::abort();
  }
  return *std::move(device);
}

Tensor Filled(CpuDevice& device, int64_t n, float lo, float hi) {
  Tensor t = *device.Allocate(DType::kF32, {n});
  // A short repeating pattern of ordinary values (no denormals to slow the loops down).
  std::vector<float> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) {
    pattern[i] = lo + (hi - lo) * static_cast<float>((i * 2654435761u) % 4096) / 4096.0f;
  }
  for (int64_t i = 0; i < n; i += 4096) {
    const int64_t m = std::min<int64_t>(4096, n - i);
    if (!device.CopyFromHost(pattern.data(), DType::kF32, m, t, i).ok()) std::abort();
  }
  return t;
}

void ReportStep(benchmark::State& state, int64_t n, double bytes_per_param, double seconds) {
  const double params = static_cast<double>(n) * state.iterations();
  state.counters["params/s"] = benchmark::Counter(params, benchmark::Counter::kIsRate);
  state.counters["GB/s"] =
      benchmark::Counter(params * bytes_per_param / 1e9, benchmark::Counter::kIsRate);
  if (bench::TriadGbps() > 0.0) {
    state.counters["ratio"] = params * bytes_per_param / seconds / 1e9 / bench::TriadGbps();
  }
}

// Args: {params, threads (0 = all cores)}.
void BM_AdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)));
  Tensor g = Filled(*device, n, -1.0f, 1.0f), p = Filled(*device, n, -2.0f, 2.0f);
  Tensor m = Filled(*device, n, -0.1f, 0.1f), v = Filled(*device, n, 0.01f, 1.0f);
  int64_t step = 100;
  double total = 0.0;
  for (auto _ : state) {
    const math::AdamWArgs args =
        math::MakeAdamWArgs(1e-4, 0.9, 0.999, 1e-8, 0.01, true, true, ++step);
    const Clock::time_point start = Clock::now();
    if (!device->updates().AdamW(args, g, p, m, v).ok()) state.SkipWithError("AdamW failed");
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  ReportStep(state, n, kAdamWBytesPerParam, total);
}

void BM_Sgd(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)));
  Tensor g = Filled(*device, n, -1.0f, 1.0f), p = Filled(*device, n, -2.0f, 2.0f);
  Tensor b = Filled(*device, n, -0.5f, 0.5f);
  math::SgdArgs args;
  args.lr = 1e-4f;
  args.momentum = 0.9f;
  args.weight_decay = 0.01f;
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    if (!device->updates().Sgd(args, g, p, &b).ok()) state.SkipWithError("Sgd failed");
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  ReportStep(state, n, kSgdBytesPerParam, total);
}

constexpr int64_t k16M = int64_t{16} << 20;
constexpr int64_t k64M = int64_t{64} << 20;

// Registration order is run order: the triads first, so that the steps can report their ratio.
BENCHMARK(BM_Triad)
    ->Args({k64M, 1})
    ->Args({k64M, 0})
    ->ArgNames({"elements", "streaming"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamW)
    ->Args({k16M, 0})
    ->Args({k64M, 0})
    ->Args({k16M, 1})
    ->ArgNames({"params", "threads"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sgd)
    ->Args({k16M, 0})
    ->Args({k64M, 0})
    ->ArgNames({"params", "threads"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  optstep::bench::SummaryReporter reporter({"params/s", "GB/s", "ratio", "bus_GB/s"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary(
      "Summary (ratio = GB/s / streaming triad GB/s; bus_GB/s counts write-allocate)");
  benchmark::Shutdown();
  return 0;
}
