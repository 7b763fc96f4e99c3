// The element-wise loops built for the build's own target (x86-64-v2); see cpu_elementwise.h.

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

const CpuElementwiseKernels& BaselineElementwiseKernels() { return kLoops; }

}  // namespace internal
}  // namespace optstep
