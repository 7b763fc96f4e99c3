// The element-wise loops built for x86-64-v3 (AVX2); see cpu_elementwise.h.

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

const CpuElementwiseKernels& Avx2ElementwiseKernels() { return kLoops; }

}  // namespace internal
}  // namespace optstep
