#include "kernels/cpu/cpu_isa.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

CpuIsa Probe() {
  // __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers (XGETBV).
  // __builtin_cpu_init: the probe may run from a static initializer, before libgcc's own.
#if defined(__x86_64__)
  __builtin_cpu_init();
#endif
#if defined(__x86_64__) && !defined(__clang__)
  if (__builtin_cpu_supports("x86-64-v4")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return CpuIsa::kAvx2;
#elif defined(__x86_64__)
  // Clang 14 knows no level names (nor "f16c", which every AVX2 CPU has): the levels' features.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  if (v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd")) {
    return CpuIsa::kAvx512;
  }
  if (v3) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return "baseline";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<CpuIsa> ParseCpuIsa(absl::string_view name) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(kCpuIsaEnv, "=", name, ": expected baseline, avx2 or avx512"));
}

CpuIsa DetectCpuIsa() {
  static const CpuIsa detected = Probe();
  return detected;
}

absl::StatusOr<CpuIsa> ResolveCpuIsa(const char* forced, CpuIsa detected) {
  if (forced == nullptr || *forced == '\0') return detected;
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(forced);
  if (!isa.ok()) return isa.status();
  if (static_cast<int>(*isa) > static_cast<int>(detected)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kCpuIsaEnv, "=", forced, ": this CPU supports at most ", CpuIsaName(detected)));
  }
  return *isa;
}

}  // namespace optstep
