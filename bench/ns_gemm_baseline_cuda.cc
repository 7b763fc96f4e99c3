// The bare cuBLAS Newton–Schulz GEMM sequence (ns_gemm_baseline.h).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bench/bench_util.h"
#include "bench/ns_gemm_baseline.h"
#include "benchmark/benchmark.h"
#include "server/optim/newton_schulz.h"

namespace optstep {
namespace bench {
namespace {

// The GPU ordinal of "cuda" / "cuda:N"; -1 for anything else.
int CudaOrdinal(absl::string_view kind) {
  if (kind == "cuda") return 0;
  int ordinal = -1;
  if (!absl::ConsumePrefix(&kind, "cuda:") || !absl::SimpleAtoi(kind, &ordinal)) return -1;
  return ordinal;
}

// A cudaMalloc'ed fp32 buffer, filled from a fixed pattern in [-1, 1).
class DeviceFloats {
 public:
  explicit DeviceFloats(int64_t n) {
    if (cudaMalloc(&data_, n * sizeof(float)) != cudaSuccess) std::abort();
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) {
      host[i] = -1.0f + 2.0f * static_cast<float>((i * 2654435761u) % 4096) / 4096.0f;
    }
    if (cudaMemcpy(data_, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
      std::abort();
    }
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { cudaFree(data_); }
  float* get() const { return data_; }

 private:
  float* data_ = nullptr;
};

// Args: {rows, cols}; X is {r, c} row-major with r = min(rows, cols), as NsOpenBlas.
void BM_NsCublas(benchmark::State& state, int ordinal) {
  const int64_t r = std::min(state.range(0), state.range(1));
  const int64_t c = std::max(state.range(0), state.range(1));
  if (cudaSetDevice(ordinal) != cudaSuccess) return state.SkipWithError("cudaSetDevice failed");
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    return state.SkipWithError("cublasCreate failed");
  }
  DeviceFloats x(r * c), y(r * c), a(r * r), b(r * r);
  const NewtonSchulzOptions options;
  bool ok = true;
  // Row-major {r, c} X is column-major {c, r} Xᵀ: A = X·Xᵀ is gemm(Tᵀ, N) of Xᵀ with itself, and
  // Y = B·X is Yᵀ = Xᵀ·Bᵀ (B symmetric up to rounding; the cost is what is measured).
  auto run = [&] {
    float* X = x.get();
    float* Y = y.get();
    const float one = 1.0f, zero = 0.0f;
    for (int k = 0; k < 5; ++k) {
      const NsCoefficients co = CoefficientsForStep(options, k);
      ok &= cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, r, r, c, &one, X, c, X, c, &zero, a.get(),
                        r) == CUBLAS_STATUS_SUCCESS;
      ok &= cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, r, r, r, &co.c, a.get(), r, a.get(), r,
                        &co.b, b.get(), r) == CUBLAS_STATUS_SUCCESS;
      ok &= cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, c, r, r, &one, X, c, b.get(), r, &co.a, Y,
                        c) == CUBLAS_STATUS_SUCCESS;
      std::swap(X, Y);
    }
    ok &= cudaDeviceSynchronize() == cudaSuccess;
  };
  run();  // warm up (cuBLAS picks its kernels)
  const double total = TimeIterations(state, run);
  cublasDestroy(handle);
  if (!ok) return state.SkipWithError("a cuBLAS call failed");
  state.counters["GFLOP/s"] = NewtonSchulz::Flops(r, c, 5) * state.iterations() / total / 1e9;
  state.counters["held_MB"] = (2.0 * r * c + 2.0 * r * r) * 4 / 1e6;
}

}  // namespace

std::string RegisterNsGemmBaseline(const std::string& device_kind) {
  const int ordinal = CudaOrdinal(device_kind);
  if (ordinal < 0) return "";
  WithNsGemmShapes(benchmark::RegisterBenchmark(
      "NsCublas", [ordinal](benchmark::State& s) { BM_NsCublas(s, ordinal); }));
  return "NsCublas/";
}

}  // namespace bench
}  // namespace optstep
