#include "kernels/cpu/cpu_gemm_backend.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "oneapi/dnnl/dnnl.h"

namespace optstep {

const char* CpuGemmBackendName(CpuGemmBackend backend) {
  switch (backend) {
    case CpuGemmBackend::kOpenBlas:
      return "openblas";
    case CpuGemmBackend::kOneDnn:
      return "onednn";
  }
  return "unknown";
}

bool OneDnnHasBf16Isa() {
  // The ISA values are nested bit masks: AMX's includes AVX512-BF16's.
  static const bool has = [] {
    const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return has;
}

absl::StatusOr<CpuGemmBackend> ResolveCpuGemmBackend(const char* forced, bool bf16_isa) {
  const absl::string_view value = forced == nullptr ? "" : forced;
  if (value.empty() || value == "auto") {
    return bf16_isa ? CpuGemmBackend::kOneDnn : CpuGemmBackend::kOpenBlas;
  }
  if (value == "openblas") return CpuGemmBackend::kOpenBlas;
  if (value == "onednn") {
    if (bf16_isa) return CpuGemmBackend::kOneDnn;
    return absl::InvalidArgumentError(
        absl::StrCat(kCpuGemmEnv, "=onednn: oneDNN finds no AVX512-BF16 or AMX on this CPU"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(kCpuGemmEnv, "=", value, ": expected auto, openblas or onednn"));
}

}  // namespace optstep
