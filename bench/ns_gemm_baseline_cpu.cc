// Builds without CUDA: there is no GPU BLAS to measure against.

#include "bench/ns_gemm_baseline.h"

namespace optstep {
namespace bench {

std::string RegisterNsGemmBaseline(const std::string& /*device_kind*/) { return ""; }

}  // namespace bench
}  // namespace optstep
