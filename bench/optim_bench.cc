// The emerging optimizers on one device against the machine's limits.
//
//   bazel run -c opt //bench:optim_bench                          # CPU
//   bazel run -c opt --config=cuda //bench:optim_bench -- --device=cuda
//   bazel run -c opt //bench:optim_bench -- --benchmark_filter=NewtonSchulz
//
// 1. Bandwidth: the streaming triad (bench_util.h) on the CPU, a device Copy (8 B/element) on a
//    GPU; every "ratio" divides by it.
// 2. Element-wise parts (16M elements): AdamW 28 B/element (reads g, p, m, v; writes p, m, v),
//    Lion 20 (reads g, p, m; writes p, m),
//    MuonMomentum 24 (reads g, p, b; writes p, b, u), Adamuon 20 (reads O, p, v; writes p, v),
//    SoapAdam 24 (reads g, M, V; writes M, V, D), Axpby 12 (reads x, y; writes y). Writes of a
//    line not read before (u, D) may cost a further read (write-allocate); not counted.
// 3. Newton–Schulz (quintic × 5) per matrix, 1024×1024, 1024×4096 and 4096×1024, through the
//    device (NewtonSchulz: norm, transpose rule, copies, GEMMs) and the same GEMM sequence called
//    directly on the device's BLAS (5 × [X·Xᵀ, c·A·A + b·A, B·X + a·X]): OpenBLAS on the CPU,
//    cuBLAS on a GPU (ns_gemm_baseline.h); the summary prints the overhead.
// 4. One optimizer step of a GPT-2-small-like model (124.4M parameters, gpt_layout.h) under the
//    Megatron presets muon, adaptive_muon, soap, lion (and adam for scale): to keep the run short
//    the benchmark times one transformer layer and the rest (embeddings, final norm) separately;
//    the summary extrapolates rest + 12 × layer. SOAP runs its first step (eigh) untimed; the
//    timed steps refresh with power iteration + QR every step (F = 1).
// Every benchmark reports peak_RSS_MB (getrusage, reset before each benchmark's setup) next to
// held_MB, the bytes its tensors hold on the device (parameters, gradients, state, scratch).

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpt_layout.h"
#include "bench/ns_gemm_baseline.h"
#include "benchmark/benchmark.h"
#include "kernels/device.h"
#include "kernels/device_factory.h"
#include "kernels/math/emerging.h"
#include "server/optim/newton_schulz.h"
#include "server/optim/presets.h"

namespace optstep {
namespace {

using bench::Clock;
using bench::Seconds;

std::string g_device_kind = "cpu";
// The name prefix of the bare GEMM sequence Newton–Schulz is measured against.
std::string g_gemm_baseline = "NsOpenBlas/";
// GB/s of the device Copy (GPU runs): the denominator there.
double g_copy_gbps = 0.0;

std::unique_ptr<Device> MakeDevice() {
  DeviceOptions options;
  options.kind = g_device_kind;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    std::abort();
  }
  return *std::move(device);
}

void Check(benchmark::State& state, const absl::Status& status) {
  if (!status.ok()) state.SkipWithError(status.ToString().c_str());
}

Tensor Filled(Device& device, const Shape& shape, float lo, float hi) {
  Tensor t = *device.Allocate(DType::kF32, shape);
  std::vector<float> pattern(4096);
  for (size_t i = 0; i < pattern.size(); ++i) {
    pattern[i] = lo + (hi - lo) * static_cast<float>((i * 2654435761u) % 4096) / 4096.0f;
  }
  for (int64_t i = 0; i < t.numel(); i += 4096) {
    const int64_t m = std::min<int64_t>(4096, t.numel() - i);
    if (!device.CopyFromHost(pattern.data(), DType::kF32, m, t, i).ok()) std::abort();
  }
  return t;
}

void ReportMemory(benchmark::State& state, const Device& device) {
  state.counters["held_MB"] = static_cast<double>(device.allocated_bytes()) / 1e6;
  state.counters["peak_RSS_MB"] = static_cast<double>(bench::PeakRssBytes()) / 1e6;
}

double Bandwidth() { return g_device_kind == "cpu" ? bench::TriadGbps() : g_copy_gbps; }

// ---- 1. bandwidth -----------------------------------------------------------------------------

void BM_Triad(benchmark::State& state) {
  bench::ResetPeakRss();
  bench::TriadBenchmark(state);
  state.counters["held_MB"] = 3.0 * state.range(0) * 4 / 1e6;
  state.counters["peak_RSS_MB"] = static_cast<double>(bench::PeakRssBytes()) / 1e6;
}

void BM_DeviceCopy(benchmark::State& state) {
  bench::ResetPeakRss();
  std::unique_ptr<Device> device = MakeDevice();
  Tensor a = Filled(*device, {state.range(0)}, -1.0f, 1.0f);
  Tensor b = Filled(*device, {state.range(0)}, -1.0f, 1.0f);
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Check(state, device->Copy(a, b));
    Check(state, device->Synchronize());
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  g_copy_gbps = 8.0 * state.range(0) * state.iterations() / total / 1e9;
  state.counters["GB/s"] = g_copy_gbps;
  ReportMemory(state, *device);
}

// ---- 2. element-wise parts --------------------------------------------------------------------

struct Elementwise {
  const char* name;
  double bytes_per_element;
  int tensors;
  std::function<absl::Status(Device&, std::vector<Tensor>&)> run;
};

const std::vector<Elementwise>& ElementwiseOps() {
  static const auto* ops = new std::vector<Elementwise>{
      {"adamw", 28, 4,
       [](Device& d, std::vector<Tensor>& t) {
         return d.updates().AdamW(math::MakeAdamWArgs(1e-4, 0.9, 0.999, 1e-8, 0.01, true, true, 10),
                                  t[0], t[1], t[2], t[3]);
       }},
      {"lion", 20, 3,
       [](Device& d, std::vector<Tensor>& t) {
         return d.updates().Lion(
             math::MakeLionArgs(1e-4, 0.9, 0.99, math::WeightDecayMode::kDecoupled, 0.01), t[0],
             t[1], t[2]);
       }},
      {"muon_momentum", 24, 4,
       [](Device& d, std::vector<Tensor>& t) {
         return d.updates().MuonMomentum(
             math::MakeMuonMomentumArgs(0.95, true, math::WeightDecayMode::kDecoupled, 1e-4, 0.01),
             t[0], t[1], t[2], t[3]);
       }},
      {"adamuon", 20, 3,
       [](Device& d, std::vector<Tensor>& t) {
         return d.updates().Adamuon(math::MakeMoment2Args(1e-4, 0.95, 1e-8, 1), t[0], t[1], t[2]);
       }},
      {"soap_adam", 24, 4,
       [](Device& d, std::vector<Tensor>& t) {
         return d.updates().SoapAdam(math::MakeSoapAdamArgs(0.9, 0.999, 1e-8, true, false, 10),
                                     t[0], t[1], t[2], t[3]);
       }},
      {"axpby", 12, 2,
       [](Device& d, std::vector<Tensor>& t) { return d.Axpby(-1e-4f, t[0], 1.0f, t[1]); }},
  };
  return *ops;
}

void BM_Elementwise(benchmark::State& state, const Elementwise& op) {
  bench::ResetPeakRss();
  const int64_t n = state.range(0);
  std::unique_ptr<Device> device = MakeDevice();
  std::vector<Tensor> tensors;
  for (int i = 0; i < op.tensors; ++i) tensors.push_back(Filled(*device, {n}, 0.01f, 1.0f));
  Check(state, op.run(*device, tensors));  // warm up
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Check(state, op.run(*device, tensors));
    Check(state, device->Synchronize());
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  const double gbps = op.bytes_per_element * n * state.iterations() / total / 1e9;
  state.counters["GB/s"] = gbps;
  if (Bandwidth() > 0.0) state.counters["ratio"] = gbps / Bandwidth();
  ReportMemory(state, *device);
}

// ---- 3. Newton–Schulz -------------------------------------------------------------------------

// Args: {rows, cols, precision (0 highest, 2 medium)}.
void BM_NewtonSchulz(benchmark::State& state) {
  bench::ResetPeakRss();
  const int64_t rows = state.range(0), cols = state.range(1);
  std::unique_ptr<Device> device = MakeDevice();
  NewtonSchulzOptions options;
  options.precision = static_cast<MatmulPrecision>(state.range(2));
  NewtonSchulz ns(options);
  Tensor x = Filled(*device, {rows, cols}, -1.0f, 1.0f);
  Tensor out = *device->Allocate(DType::kF32, {rows, cols});
  Check(state, ns.Run(*device, x, out));  // warm up (workspace)
  double total = 0.0;
  const double cpu_start = bench::ProcessCpuSeconds();
  const int64_t sleeps_start = bench::ProcessSleeps();
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Check(state, ns.Run(*device, x, out));
    Check(state, device->Synchronize());
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  state.counters["cpu_s"] = (bench::ProcessCpuSeconds() - cpu_start) / state.iterations();
  state.counters["sleeps"] =
      static_cast<double>(bench::ProcessSleeps() - sleeps_start) / state.iterations();
  state.counters["GFLOP/s"] = NewtonSchulz::Flops(rows, cols, 5) * state.iterations() / total / 1e9;
  ReportMemory(state, *device);
}

// The same GEMMs straight on OpenBLAS (CPU): X {r, c} with r = min(rows, cols).
void BM_NsOpenBlas(benchmark::State& state) {
  bench::ResetPeakRss();
  const int64_t r = std::min(state.range(0), state.range(1));
  const int64_t c = std::max(state.range(0), state.range(1));
  bench::Buffer x = bench::AllocateFirstTouch(r * c, 0.01f),
                y = bench::AllocateFirstTouch(r * c, 0.0f);
  bench::Buffer a = bench::AllocateFirstTouch(r * r, 0.0f),
                b = bench::AllocateFirstTouch(r * r, 0.0f);
  NewtonSchulzOptions options;
  auto run = [&] {
    float* X = x.get();
    float* Y = y.get();
    for (int k = 0; k < 5; ++k) {
      const NsCoefficients co = CoefficientsForStep(options, k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, X, c, X, c, 0.0f, a.get(),
                  r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, co.c, a.get(), r, a.get(), r,
                  co.b, b.get(), r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1.0f, b.get(), r, X, c, co.a,
                  Y, c);
      std::swap(X, Y);
    }
  };
  // OpenBLAS with its own thread pool (a CpuDevice sets it to one thread and splits the GEMMs
  // over its OpenMP threads instead); restored afterwards.
  openblas_set_num_threads(omp_get_max_threads());
  run();
  const double cpu_start = bench::ProcessCpuSeconds();
  const double total = bench::TimeIterations(state, run);
  state.counters["cpu_s"] = (bench::ProcessCpuSeconds() - cpu_start) / state.iterations();
  openblas_set_num_threads(1);
  state.counters["GFLOP/s"] = NewtonSchulz::Flops(r, c, 5) * state.iterations() / total / 1e9;
  state.counters["held_MB"] = (2.0 * r * c + 2.0 * r * r) * 4 / 1e6;
  state.counters["peak_RSS_MB"] = static_cast<double>(bench::PeakRssBytes()) / 1e6;
}

// ---- 4. GPT-like steps ------------------------------------------------------------------------

void BM_GptStep(benchmark::State& state, const std::string& preset,
                const std::map<std::string, std::string>& args, bool layer) {
  bench::ResetPeakRss();
  std::unique_ptr<Device> device = MakeDevice();
  const bench::GptShape shape;
  std::vector<ParamInfo> params = layer ? bench::GptLayer(shape, 0) : bench::GptRest(shape);
  const int64_t elements = bench::CountElements(params);
  absl::StatusOr<ChainConfig> chain = ExpandPreset(preset, args);
  if (!chain.ok()) return state.SkipWithError(chain.status().ToString().c_str());
  absl::StatusOr<std::unique_ptr<bench::ChainStepper>> stepper =
      bench::ChainStepper::Create(*device, *chain, std::move(params));
  if (!stepper.ok()) return state.SkipWithError(stepper.status().ToString().c_str());
  Check(state, (*stepper)->Step());  // the first step (SOAP: eigh), untimed
  double total = 0.0;
  const double cpu_start = bench::ProcessCpuSeconds();
  const int64_t sleeps_start = bench::ProcessSleeps();
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    Check(state, (*stepper)->Step());
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  state.counters["step_s"] = total / state.iterations();
  // CPU seconds of the process per step: what a loaded machine distorts least.
  state.counters["cpu_s"] = (bench::ProcessCpuSeconds() - cpu_start) / state.iterations();
  // Threads put to sleep per step: the synchronisations that cost wall time on an idle machine.
  state.counters["sleeps"] =
      static_cast<double>(bench::ProcessSleeps() - sleeps_start) / state.iterations();
  state.counters["Mparams"] = static_cast<double>(elements) / 1e6;
  ReportMemory(state, *device);
}

struct GptRun {
  std::string label;
  std::string preset;
  std::map<std::string, std::string> args;
};

const std::vector<GptRun>& GptRuns() {
  static const auto* runs = new std::vector<GptRun>{
      {"adam", "adam", {}},
      {"lion", "lion", {}},
      {"muon", "muon", {}},
      {"muon_highest", "muon", {{"muon_fp32_matmul_prec", "highest"}}},
      {"adaptive_muon", "adaptive_muon", {}},
      {"soap", "soap", {}},
      {"soap_medium",
       "soap",
       {{"soap_fp32_matmul_prec", "medium"}, {"soap_qr_fp32_matmul_prec", "medium"}}},
  };
  return *runs;
}

void RegisterAll() {
  constexpr int64_t k32M = int64_t{32} << 20;
  constexpr int64_t k16M = int64_t{16} << 20;
  if (g_device_kind == "cpu") {
    benchmark::RegisterBenchmark("Triad", BM_Triad)
        ->Args({k32M, 1})
        ->ArgNames({"elements", "streaming"})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  } else {
    benchmark::RegisterBenchmark("DeviceCopy", BM_DeviceCopy)
        ->Arg(int64_t{256} << 20)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const Elementwise& op : ElementwiseOps()) {
    benchmark::RegisterBenchmark((std::string("Elementwise/") + op.name).c_str(),
                                 [&op](benchmark::State& s) { BM_Elementwise(s, op); })
        ->Arg(k16M)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  auto* ns = benchmark::RegisterBenchmark("NewtonSchulz", BM_NewtonSchulz);
  for (int precision : {0, 2}) {
    for (auto [r, c] : {std::pair<int64_t, int64_t>{1024, 1024}, {1024, 4096}, {4096, 1024}}) {
      ns->Args({r, c, precision});
    }
  }
  ns->ArgNames({"rows", "cols", "prec"})->UseManualTime()->Unit(benchmark::kMillisecond);
  if (g_device_kind == "cpu") {
    bench::WithNsGemmShapes(benchmark::RegisterBenchmark("NsOpenBlas", BM_NsOpenBlas));
  } else {
    g_gemm_baseline = bench::RegisterNsGemmBaseline(g_device_kind);
  }
  for (const GptRun& run : GptRuns()) {
    for (bool layer : {true, false}) {
      const std::string name =
          std::string("GptStep/") + run.label + (layer ? "/one_layer" : "/rest");
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&run, layer](benchmark::State& s) { BM_GptStep(s, run.preset, run.args, layer); })
          ->Iterations(2)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Newton–Schulz through the device against the bare GEMM sequence (CPU time too on the CPU,
// where both use the same cores).
void PrintNsOverhead(const bench::SummaryReporter& reporter) {
  const bool cpu = g_gemm_baseline == "NsOpenBlas/";
  std::printf("\nNewton–Schulz (quintic × 5, highest) against the bare %s GEMM sequence\n",
              cpu ? "OpenBLAS" : "cuBLAS");
  for (const char* shape : {"rows:1024/cols:1024", "rows:1024/cols:4096", "rows:4096/cols:1024"}) {
    const std::string ns_name = std::string("NewtonSchulz/") + shape + "/prec:0";
    const std::string blas_name = g_gemm_baseline + shape;
    const double ns = reporter.Find(ns_name, "GFLOP/s");
    const double blas = reporter.Find(blas_name, "GFLOP/s");
    std::printf("  %-22s %7.1f vs %7.1f GFLOP/s: overhead %+.1f%% wall", shape, ns, blas,
                100.0 * (blas / ns - 1.0));
    if (cpu) {
      std::printf(
          ", %+.1f%% CPU time",
          100.0 * (reporter.Find(ns_name, "cpu_s") / reporter.Find(blas_name, "cpu_s") - 1.0));
    }
    std::printf(" (goal <= 15%%)\n");
  }
}

void PrintDerived(const bench::SummaryReporter& reporter) {
  if (!g_gemm_baseline.empty()) PrintNsOverhead(reporter);
  const bench::GptShape shape;
  std::printf(
      "\nOne step of the 124.4M-parameter GPT-like model, extrapolated: rest + %ld x layer\n",
      static_cast<long>(shape.layers));
  for (const GptRun& run : GptRuns()) {
    const double layer = reporter.Find("GptStep/" + run.label + "/one_layer", "step_s");
    const double rest = reporter.Find("GptStep/" + run.label + "/rest", "step_s");
    std::printf("  %-14s layer %8.3f s   rest %8.3f s   => step %8.2f s\n", run.label.c_str(),
                layer, rest, rest + shape.layers * layer);
  }
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  // --device=cpu|cuda|cuda:N (ours), the rest for Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--device=", 9) == 0) {
      optstep::g_device_kind = argv[i] + 9;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  optstep::RegisterAll();
  optstep::bench::SummaryReporter reporter({"GB/s", "ratio", "GFLOP/s", "cpu_s", "sleeps", "step_s",
                                            "Mparams", "held_MB", "peak_RSS_MB"});
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary("Summary (" + optstep::g_device_kind + "; ratio = GB/s / " +
                        (optstep::g_device_kind == "cpu" ? "streaming triad" : "device copy") +
                        " GB/s)");
  optstep::PrintDerived(reporter);
  benchmark::Shutdown();
  return 0;
}
