#ifndef OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_
#define OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_

// OPTSTEP_HD marks the per-element formulas that both the CPU loops (g++) and the CUDA kernels
// (nvcc) compile from the same source.
#if defined(__CUDACC__)
#define OPTSTEP_HD __host__ __device__ __forceinline__
#else
#define OPTSTEP_HD inline
#endif

#endif  // OPTSTEP_KERNELS_MATH_HOST_DEVICE_H_
