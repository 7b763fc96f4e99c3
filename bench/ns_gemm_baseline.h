// The Newton–Schulz GEMM sequence of optim_bench called straight on the GPU's BLAS (cuBLAS), the
// reference that the device's NewtonSchulz is measured against on a GPU (on the CPU the
// reference is OpenBLAS, in optim_bench.cc).
//
// Two implementations, chosen by the build: ns_gemm_baseline_cuda.cc under --config=cuda,
// ns_gemm_baseline_cpu.cc (no GPU baseline) otherwise.

#ifndef OPTSTEP_BENCH_NS_GEMM_BASELINE_H_
#define OPTSTEP_BENCH_NS_GEMM_BASELINE_H_

#include <string>

#include "benchmark/benchmark.h"

namespace optstep {
namespace bench {

// The {rows, cols} shapes of a bare GEMM-sequence benchmark (1024×1024, 1024×4096, 4096×1024),
// manually timed, in milliseconds. Returns `b`.
inline benchmark::internal::Benchmark* WithNsGemmShapes(benchmark::internal::Benchmark* b) {
  return b->Args({1024, 1024})
      ->Args({1024, 4096})
      ->Args({4096, 1024})
      ->ArgNames({"rows", "cols"})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

// Registers "NsCublas/rows:R/cols:C" for the three optim_bench shapes when `device_kind` names a
// CUDA device ("cuda", "cuda:N") and this build has CUDA; registers nothing otherwise. Each
// iteration runs 5 × [A = X·Xᵀ, B = c·A·A + b·B, Y = B·X + a·Y] in fp32 (no TF32, as the device's
// "highest" precision) on the device `device_kind` names and reports GFLOP/s.
// Returns the benchmarks' name prefix ("NsCublas/"), or "" when none were registered.
std::string RegisterNsGemmBaseline(const std::string& device_kind);

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_NS_GEMM_BASELINE_H_
