#include "kernels/cpu/cpu_elementwise.h"

namespace optstep {
namespace internal {

const CpuElementwiseKernels& ElementwiseKernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return Avx512ElementwiseKernels();
    case CpuIsa::kAvx2:
      return Avx2ElementwiseKernels();
    case CpuIsa::kBaseline:
      break;
  }
  return BaselineElementwiseKernels();
}

}  // namespace internal
}  // namespace optstep
