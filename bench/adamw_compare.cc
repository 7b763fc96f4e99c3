// optstep's side of bench/compare/adamw.py: AdamW steps of CpuDevice on one fp32 tensor of 16M
// and of 64M parameters and on the GPT-2-small layout (124M parameters in 148 tensors, stepped in
// batches of up to 16 MiB of parameters as the engine steps a group, BM_AdamW, or one tensor
// after another, BM_AdamWPerTensor), and on 2048 tensors of 16384 parameters (params:-1, each
// too small for more than one thread on its own), next to the streaming triad, as Google
// Benchmark runs (the script reads --benchmark_format=json).
//
//   bazel run -c opt //bench:adamw_compare
//   bazel run -c opt //bench:adamw_compare -- --layout   # the 124M layout's shapes, one a line
//
// OPTSTEP_CPU_ISA picks a narrower variant of the element-wise loops (kernels/cpu/cpu_isa.h).
// Counters: params/s, and `ratio`, the step's bus GB/s (28 B a parameter, kernels_bench.cc)
// over the streaming triad's GB/s.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "bench/bench_util.h"
#include "bench/gpt_layout.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"
#include "kernels/update_kernels.h"
#include "server/optim/optimizer.h"

namespace optstep {
namespace {

constexpr double kAdamWBytesPerParam = 28;

// Element counts of the GPT-2-small layout's tensors.
std::vector<Shape> GptShapes() {
  const bench::GptShape shape;
  std::vector<ParamInfo> params = bench::GptRest(shape);
  for (int layer = 0; layer < shape.layers; ++layer) {
    std::vector<ParamInfo> more = bench::GptLayer(shape, layer);
    params.insert(params.end(), more.begin(), more.end());
  }
  std::vector<Shape> out;
  for (const ParamInfo& p : params) out.push_back(p.shape);
  return out;
}

// One parameter tensor with its gradient and moments, filled with ordinary values.
struct AdamWTensors {
  Tensor g, p, m, v;
};

AdamWTensors Make(CpuDevice& device, const Shape& shape) {
  AdamWTensors t{*device.Allocate(DType::kF32, shape), *device.Allocate(DType::kF32, shape),
                 *device.Allocate(DType::kF32, shape), *device.Allocate(DType::kF32, shape)};
  const int64_t n = t.p.numel();
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 2654435761u) % 4096) / 4096;
  for (Tensor* x : {&t.g, &t.p, &t.m, &t.v}) {
    if (!device.CopyFromHost(values.data(), DType::kF32, n, *x, 0).ok()) std::abort();
  }
  return t;
}

// Tensors of the many-small-tensors case: each below CpuContext::kMinParallelElements, which
// AdamW tensor by tensor runs on one thread.
constexpr int64_t kSmallTensors = 2048;
constexpr int64_t kSmallTensorElements = 16384;

// The tensors of one case: {params of one tensor; 0 = the GPT-2-small layout; -1 = kSmallTensors
// tensors of kSmallTensorElements}.
std::vector<AdamWTensors> MakeCase(CpuDevice& device, int64_t params, int64_t* n) {
  std::vector<Shape> shapes;
  if (params == 0) {
    shapes = GptShapes();
  } else if (params < 0) {
    shapes.assign(kSmallTensors, Shape{kSmallTensorElements});
  } else {
    shapes = {{params}};
  }
  std::vector<AdamWTensors> tensors;
  *n = 0;
  for (const Shape& shape : shapes) {
    tensors.push_back(Make(device, shape));
    *n += tensors.back().p.numel();
  }
  return tensors;
}

// The tensors in batches of at most `batch_bytes` of parameters together, as the engine batches a
// group's parameters (server/engine/owned_update.h); 0 = one at a time.
std::vector<std::vector<AdamWOperands>> Batches(std::vector<AdamWTensors>& tensors,
                                                int64_t batch_bytes) {
  std::vector<int64_t> bytes;
  for (const AdamWTensors& t : tensors) bytes.push_back(t.p.numel() * 4);
  std::vector<std::vector<AdamWOperands>> batches;
  size_t next = 0;
  for (int length : BatchLengths(bytes, batch_bytes)) {
    std::vector<AdamWOperands>& batch = batches.emplace_back();
    for (; length > 0; --length, ++next) {
      AdamWTensors& t = tensors[next];
      batch.push_back({&t.g, &t.p, &t.m, &t.v});
    }
  }
  return batches;
}

// Args: {params of one tensor; 0 = the GPT-2-small layout}. `batch_bytes` as Batches.
void RunAdamW(benchmark::State& state, int64_t batch_bytes) {
  std::unique_ptr<CpuDevice> device = *CpuDevice::Create({});
  int64_t n = 0;
  std::vector<AdamWTensors> tensors = MakeCase(*device, state.range(0), &n);
  const std::vector<std::vector<AdamWOperands>> batches = Batches(tensors, batch_bytes);
  state.SetLabel(device->cpu_isa());
  int64_t step = 100;
  double total = 0.0;
  for (auto _ : state) {
    const math::AdamWArgs args =
        math::MakeAdamWArgs(1e-4, 0.9, 0.999, 1e-8, 0.01, true, true, ++step);
    const bench::Clock::time_point start = bench::Clock::now();
    for (const std::vector<AdamWOperands>& batch : batches) {
      if (!device->updates().AdamWBatch(args, batch).ok()) state.SkipWithError("AdamWBatch");
    }
    const double s = bench::Seconds(start, bench::Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  const double params = static_cast<double>(n) * state.iterations();
  state.counters["params/s"] = benchmark::Counter(params, benchmark::Counter::kIsRate);
  state.counters["batches"] = static_cast<double>(batches.size());
  if (bench::TriadGbps() > 0.0) {
    state.counters["ratio"] = params * kAdamWBytesPerParam / total / 1e9 / bench::TriadGbps();
  }
}

// As the engine steps an AdamW group.
void BM_AdamW(benchmark::State& state) { RunAdamW(state, kStepBatchBytes); }

// One tensor at a time, one parallel region each (the engine before batching).
void BM_AdamWPerTensor(benchmark::State& state) { RunAdamW(state, 0); }

void BM_Triad(benchmark::State& state) { bench::TriadBenchmark(state); }

BENCHMARK(BM_Triad)
    ->Args({int64_t{64} << 20, 1})
    ->ArgNames({"elements", "streaming"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamW)
    ->Arg(int64_t{16} << 20)
    ->Arg(int64_t{64} << 20)
    ->Arg(0)
    ->Arg(-1)
    ->ArgName("params")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWPerTensor)
    ->Arg(0)
    ->Arg(-1)
    ->ArgName("params")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--layout") == 0) {
    for (const optstep::Shape& shape : optstep::GptShapes()) {
      std::printf("%s\n", absl::StrJoin(shape, " ").c_str());
    }
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
