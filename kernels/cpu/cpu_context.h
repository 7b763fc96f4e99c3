#ifndef OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_
#define OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_

#include <cstdint>

namespace optstep {
namespace internal {

// What the CPU device shares with its kernel objects (CpuUpdateKernels, CpuMatrixKernels): the
// number of OpenMP threads of a parallel loop.
//
// Thread safety: immutable after construction.
struct CpuContext {
  // Loops over fewer elements run single-threaded: forking costs more than it saves.
  static constexpr int64_t kMinParallelElements = 1 << 15;

  // Threads for a loop over `n` elements.
  int ThreadsFor(int64_t n) const { return n < kMinParallelElements ? 1 : num_threads; }

  int num_threads = 1;  // >= 1
};

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_CONTEXT_H_
