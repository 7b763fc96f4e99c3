#ifndef OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_
#define OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_

// OPTSTEP_HD marks the per-element formulas that both the CPU loops (g++) and the CUDA kernels
// (nvcc) compile from the same source. Always inlined on the host too: the CPU loops are built once
// per instruction-set variant (kernels/cpu/cpu_elementwise.h), and an out-of-line copy built for a
// wide variant must never be what a narrower one calls.
#if defined(__CUDACC__)
#define OPTSTEP_HD __host__ __device__ __forceinline__
#else
#define OPTSTEP_HD inline __attribute__((always_inline))
#endif

#endif  // OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_
