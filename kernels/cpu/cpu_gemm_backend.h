#ifndef OPTSTEP_KERNELS_CPU_CPU_GEMM_BACKEND_H_
#define OPTSTEP_KERNELS_CPU_CPU_GEMM_BACKEND_H_

// Which library multiplies the CPU device's bf16-class (`medium`) matrix products: oneDNN's bf16
// matmul where oneDNN finds AVX512-BF16 or AMX on the CPU, OpenBLAS's sgemm on bf16-rounded
// inputs elsewhere (docs/optimizers.md "Matmul precision"). fp32 products (`highest`, `high`) run
// on OpenBLAS either way: oneDNN's fp32 GEMM measured no faster (docs/benchmarks.md). The
// environment variable OPTSTEP_CPU_GEMM=openblas keeps bf16 products on OpenBLAS (tests,
// benchmarks, a fallback). Stateless apart from oneDNN's ISA probe, which it caches (thread-safe).

#include "absl/status/statusor.h"

namespace optstep {

enum class CpuGemmBackend : int {
  kOpenBlas = 0,  // every product through OpenBLAS's sgemm
  kOneDnn = 1,    // bf16-class products through oneDNN (bf16 × bf16 → fp32), fp32 ones OpenBLAS
};

// The environment variable that picks a backend: unset, "" or "auto" (the best this CPU runs),
// "openblas", "onednn".
inline constexpr const char kCpuGemmEnv[] = "OPTSTEP_CPU_GEMM";

// "openblas", "onednn".
const char* CpuGemmBackendName(CpuGemmBackend backend);

// Whether oneDNN runs bf16 products with the CPU's bf16 instructions (its effective ISA includes
// AVX512-BF16; AMX CPUs have it too). oneDNN's own cap, ONEDNN_MAX_CPU_ISA, is honoured.
bool OneDnnHasBf16Isa();

// The backend to use: kOneDnn when `forced` (the value of OPTSTEP_CPU_GEMM) is unset, empty,
// "auto" or "onednn" and `bf16_isa`; kOpenBlas when `forced` is "openblas", or unset/auto without
// `bf16_isa`. INVALID_ARGUMENT for any other value, and for "onednn" without `bf16_isa`.
absl::StatusOr<CpuGemmBackend> ResolveCpuGemmBackend(const char* forced, bool bf16_isa);

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_GEMM_BACKEND_H_
