#ifndef OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_
#define OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_

#include <cstdint>

#include "kernels/cpu/cpu_elementwise.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_loops.h"

namespace optstep {
namespace internal {

// What the CPU device shares with its kernel objects (CpuUpdateKernels, CpuMatrixKernels): the
// number of OpenMP threads of a parallel loop and the element-wise loops of the chosen
// instruction-set variant.
//
// Thread safety: immutable after construction.
struct CpuContext {
  // Loops over fewer elements run single-threaded: forking costs more than it saves.
  static constexpr int64_t kMinParallelElements = 1 << 15;

  // Threads for a loop over `n` elements.
  int ThreadsFor(int64_t n) const { return n < kMinParallelElements ? 1 : num_threads; }

  int num_threads = 1;  // >= 1
  CpuIsa isa = CpuIsa::kBaseline;
  const CpuElementwiseKernels* loops = &BaselineElementwiseKernels();  // ElementwiseKernels(isa)
};

// Runs loop(args, ptrs + begin..., end - begin), a function of ctx.loops, on the device's ranges
// [begin, end) of [0, n) (ParallelFor with ctx.ThreadsFor(n) threads).
template <typename Loop, typename Args, typename... Ptrs>
void SplitLoop(const CpuContext& ctx, int64_t n, Loop loop, const Args& args, Ptrs... ptrs) {
  ParallelFor(n, ctx.ThreadsFor(n),
              [&](int64_t begin, int64_t end) { loop(args, (ptrs + begin)..., end - begin); });
}

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_
