// CPU optimizer-step throughput against this machine's memory bandwidth.
//
//   bazel run -c opt //bench:kernels_bench
//   bazel run -c opt //bench:kernels_bench -- --benchmark_filter=AdamW
//
// BM_Triad measures the bandwidth with a STREAM-like triad a[i] = b[i] + s·c[i] (fp32, OpenMP,
// all cores; bench_util.h); BM_AdamW and BM_Sgd time CpuDevice steps (all cores unless the name
// says threads:1), BM_AddBf16 the gradient accumulation from bf16 host memory (AddFromHost) and
// BM_ToBf16 the parameters' way back (CopyToHost into bf16). Each runs once per instruction-set
// variant of the element-wise loops that this CPU supports (isa:0 baseline x86-64-v2, 1 AVX2,
// 2 AVX-512; kernels/cpu/cpu_isa.h) and reports params/s, GB/s and `ratio`, its GB/s over the
// streaming triad's GB/s.
//
// Byte accounting: bytes that cross the memory bus, write-allocate included where it happens.
//   AdamW  28 B/param: reads g, p, m, v (16) and writes p, m, v (12). Every line it writes was
//          read just before, so there is no write-allocate traffic.
//   SGD    20 B/param: momentum on, reads g, p, b (12) and writes p, b (8); no write-allocate.
//   AddBf16 10 B/param: reads the bf16 gradient (2) and the fp32 sum (4), writes the sum (4).
//   ToBf16  6 B/param (+2 write-allocate): reads the fp32 parameter (4), writes bf16 (2).
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
#include "kernels/cpu/cpu_isa.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"

namespace optstep {
namespace {

constexpr double kAdamWBytesPerParam = 28;
constexpr double kSgdBytesPerParam = 20;
constexpr double kAddBf16BytesPerParam = 10;
constexpr double kToBf16BytesPerParam = 6;

using bench::Clock;
using bench::Seconds;

void BM_Triad(benchmark::State& state) { bench::TriadBenchmark(state); }

std::unique_ptr<CpuDevice> MakeDevice(int num_threads, int64_t isa) {
  CpuDevice::Options options;
  options.num_threads = num_threads;
  options.isa = CpuIsaName(static_cast<CpuIsa>(isa));
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

// Args: {params, threads (0 = all cores), isa (CpuIsa)}.
void BM_AdamW(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)), state.range(2));
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
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)), state.range(2));
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

// Times `op` (one pass over n elements) per iteration and reports it with `bytes_per_param`.
template <typename Op>
void TimePasses(benchmark::State& state, int64_t n, double bytes_per_param, const Op& op) {
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    if (!op().ok()) state.SkipWithError("device call failed");
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  ReportStep(state, n, bytes_per_param, total);
}

// bf16 host gradient bytes (a repeating pattern of ordinary values).
std::vector<uint16_t> Bf16Pattern(int64_t n) {
  std::vector<uint16_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(0x3c00u + (i * 40503u) % 0x0400u);
  return out;
}

void BM_AddBf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)), state.range(2));
  Tensor sum = Filled(*device, n, -1.0f, 1.0f);
  const std::vector<uint16_t> grad = Bf16Pattern(n);
  TimePasses(state, n, kAddBf16BytesPerParam,
             [&] { return device->AddFromHost(grad.data(), DType::kBF16, n, sum, 0); });
}

void BM_ToBf16(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::unique_ptr<CpuDevice> device = MakeDevice(static_cast<int>(state.range(1)), state.range(2));
  Tensor p = Filled(*device, n, -2.0f, 2.0f);
  std::vector<uint16_t> out = Bf16Pattern(n);  // touched before the first pass
  TimePasses(state, n, kToBf16BytesPerParam,
             [&] { return device->CopyToHost(p, 0, n, DType::kBF16, out.data()); });
}

constexpr int64_t k16M = int64_t{16} << 20;
constexpr int64_t k64M = int64_t{64} << 20;

// {sizes} × every variant this CPU runs, on `threads` threads (0 = all cores).
void AddVariants(benchmark::internal::Benchmark* b, std::vector<int64_t> sizes, int64_t threads) {
  b->ArgNames({"params", "threads", "isa"});
  for (int64_t n : sizes) {
    for (int isa = 0; isa <= static_cast<int>(DetectCpuIsa()); ++isa) b->Args({n, threads, isa});
  }
}
void Steps(benchmark::internal::Benchmark* b) { AddVariants(b, {k16M, k64M}, 0); }
void StepsOneThread(benchmark::internal::Benchmark* b) { AddVariants(b, {k16M}, 1); }
void Passes(benchmark::internal::Benchmark* b) { AddVariants(b, {k64M}, 0); }

// Registration order is run order: the triads first, so that the steps can report their ratio.
BENCHMARK(BM_Triad)
    ->Args({k64M, 1})
    ->Args({k64M, 0})
    ->ArgNames({"elements", "streaming"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamW)
    ->Apply(Steps)
    ->Apply(StepsOneThread)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Sgd)->Apply(Steps)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AddBf16)->Apply(Passes)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ToBf16)->Apply(Passes)->UseManualTime()->Unit(benchmark::kMillisecond);

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
