#ifndef OPTSTEP_KERNELS_CPU_CPU_ISA_H_
#define OPTSTEP_KERNELS_CPU_CPU_ISA_H_

// The instruction-set variants of the CPU device's element-wise loops: the binary is built for
// the portable baseline (x86-64-v2), and the loops are built once more for each wider variant
// (cpu_elementwise_*.cc); the device picks one at start from CPUID, or a lower one named by the
// environment variable OPTSTEP_CPU_ISA (tests and benchmarks). Stateless apart from the CPUID
// result, which is read once and cached (thread-safe).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {

// Ordered: each variant runs only where every variant below it runs.
enum class CpuIsa : int {
  kBaseline = 0,  // x86-64-v2 (SSE4.2): the build's own target
  kAvx2 = 1,      // x86-64-v3: AVX2, FMA, F16C, BMI2
  kAvx512 = 2,    // x86-64-v4: AVX-512 F/BW/DQ/VL/CD, 512-bit vectors
};

// The environment variable that forces a lower variant.
inline constexpr const char kCpuIsaEnv[] = "OPTSTEP_CPU_ISA";

// "baseline", "avx2", "avx512".
const char* CpuIsaName(CpuIsa isa);

// The inverse of CpuIsaName; INVALID_ARGUMENT for any other text.
absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name);

// The widest variant this CPU (and the OS's saved vector state) supports.
CpuIsa DetectCpuIsa();

// The variant to use: `forced` (the value of OPTSTEP_CPU_ISA; null or empty = none) when it names
// a variant at or below `detected`, else `detected`. INVALID_ARGUMENT when `forced` names no
// variant or one above `detected`.
absl::StatusOr<CpuIsa> ResolveCpuIsa(const char* forced, CpuIsa detected);

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_ISA_H_
