#ifndef OPTSTEP_KERNELS_CPU_CPU_ELEMENTWISE_H_
#define OPTSTEP_KERNELS_CPU_CPU_ELEMENTWISE_H_

// The CPU device's element-wise loops as one table of functions per instruction-set variant
// (cpu_isa.h). Every variant compiles the same loops (cpu_elementwise_loops.inc) from the same
// formulas (kernels/math) with -ffp-contract=off and no fast-math, so all variants give the same
// bits; only the vector width differs. Each function runs one contiguous range on the calling
// thread: the device splits the work (ParallelFor) and calls the table from each thread.
//
// Thread safety: the tables are immutable; the functions are reentrant.

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"

namespace optstep {
namespace internal {

struct CpuElementwiseKernels {
  // The optimizer updates over n elements (formulas in kernels/math).
  void (*adamw)(const math::AdamWArgs& args, const float* grad, float* param, float* exp_avg,
                float* exp_avg_sq, int64_t n);
  // `buffer` is not touched (and may be null) when args.momentum == 0.
  void (*sgd)(const math::SgdArgs& args, const float* grad, float* param, float* buffer, int64_t n);
  void (*lion)(const math::LionArgs& args, const float* grad, float* param, float* exp_avg,
               int64_t n);
  void (*muon_momentum)(const math::MuonMomentumArgs& args, const float* grad, float* param,
                        float* momentum, float* update, int64_t n);
  void (*adamuon)(const math::Moment2Args& args, const float* update, float* param, float* moment,
                  int64_t n);
  void (*soap_adam)(const math::SoapAdamArgs& args, const float* grad, float* exp_avg,
                    float* exp_avg_sq, float* direction, int64_t n);

  // dtype conversions; 16-bit buffers must be 2-byte aligned. Round to nearest even.
  void (*host_to_f32)(const void* src, DType src_dtype, int64_t n, float* dst);
  void (*f32_to_host)(const float* src, int64_t n, DType dst_dtype, void* dst);

  // dst[i] <- dst[i] + src[i] (gradient accumulation).
  void (*add)(const float* src, float* dst, int64_t n);
  // x[i] <- scale · x[i].
  void (*scale)(float scale, float* x, int64_t n);
  // y <- α·x + β·y; with β == 0, y is not read. `x` may be `y`.
  void (*axpby)(float alpha, const float* x, float beta, float* y, int64_t n);
  // Σ x² of one block of CpuDevice::ComputeGradientStats, in float64 over `lanes` partial sums
  // (element i into lane i mod lanes, lanes added from 0) — an order fixed by the data alone.
  double (*sum_squares)(const float* x, int64_t n);
};

// Partial sums of sum_squares (CpuDevice::kStatsLanes).
constexpr int kSumSquaresLanes = 16;

// The table of `isa`. REQUIRES: isa is at or below DetectCpuIsa().
const CpuElementwiseKernels& ElementwiseKernels(CpuIsa isa);

// The tables of the variant files (cpu_elementwise_<variant>.cc).
const CpuElementwiseKernels& BaselineElementwiseKernels();
const CpuElementwiseKernels& Avx2ElementwiseKernels();
const CpuElementwiseKernels& Avx512ElementwiseKernels();

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_CPU_CPU_ELEMENTWISE_H_
