// The element-wise loops built for x86-64-v4 (AVX-512, 512-bit vectors); see cpu_elementwise.h.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/math/half.h"

namespace optstep {
namespace internal {
namespace {

#include "kernels/cpu/cpu_elementwise_loops.inc"

}  // namespace

const CpuElementwiseKernels& Avx512ElementwiseKernels() { return kLoops; }

}  // namespace internal
}  // namespace optstep
