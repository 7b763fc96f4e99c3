#ifndef OPTSTEP_KERNELS_DEVICE_H_
#define OPTSTEP_KERNELS_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/matrix_kernels.h"
#include "kernels/matrix_validation.h"
#include "kernels/tensor.h"
#include "kernels/update_kernels.h"

namespace optstep {

// Result of one pass over a gradient: the sum of squares for the global norm and whether every
// element is finite.
struct GradientStats {
  double sum_squares = 0.0;
  bool all_finite = true;
};

// Runs memory management, transfers, dtype conversion and element-wise vector operations on one
// device, and owns the device's optimizer updates (updates()) and matrix primitives (matrix()),
// which share its memory, stream and threads. Implementations: CpuDevice (always built) and
// CudaDevice (--config=cuda).
//
// Thread safety: CopyFromHost and CopyToHost may be called concurrently from several threads when
// their device ranges do not overlap a tensor being updated; every other method is
// thread-compatible, and the engine's per-device worker serialises those calls.
//
// Every method validates its arguments on the host before touching memory and answers
// INVALID_ARGUMENT (mismatched sizes, ranges, dtypes) without side effects. Tensors passed to
// updates are fp32. Errors reported by the device library after validation are INTERNAL.
class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:<ordinal>".
  virtual std::string name() const = 0;
  // The instruction-set variant of the host element-wise loops ("baseline", "avx2", "avx512";
  // kernels/cpu/cpu_isa.h); empty for a device whose element-wise work runs elsewhere.
  virtual std::string cpu_isa() const { return ""; }
  // The library behind matrix().Gemm's bf16-class products ("openblas", "onednn";
  // kernels/cpu/cpu_gemm_backend.h); empty for a device whose GEMMs run elsewhere.
  virtual std::string gemm_backend() const { return ""; }

  // A zero-filled tensor. RESOURCE_EXHAUSTED when the memory cannot be had.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) = 0;
  // Bytes currently held by tensors of this device.
  virtual int64_t allocated_bytes() const = 0;
  // Total bytes of the device's own memory; 0 when the device uses the host's memory (CPU), whose
  // limit the process finds itself.
  virtual int64_t memory_capacity() const = 0;

  virtual absl::Status Zero(Tensor& tensor) = 0;

  // Converts `count` elements of `src_dtype` at host address `src` to fp32 and writes them to
  // dst[dst_offset, dst_offset + count).
  // REQUIRES: dst is fp32 and the range lies inside it.
  virtual absl::Status CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                    int64_t dst_offset) = 0;
  // The same conversion, added: dst[dst_offset + i] <- dst[dst_offset + i] + fp32(src[i]), one
  // fp32 addition per element (so that sums built from it are those of Add, bit for bit).
  // REQUIRES: as CopyFromHost.
  virtual absl::Status AddFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                                   int64_t dst_offset) = 0;
  // Converts src[offset, offset + count) (fp32) to `dst_dtype` at host address `dst`
  // (round to nearest even for bf16/fp16).
  virtual absl::Status CopyToHost(const Tensor& src, int64_t offset, int64_t count, DType dst_dtype,
                                  void* dst) = 0;

  // dst <- src. REQUIRES: same dtype and number of elements.
  virtual absl::Status Copy(const Tensor& src, Tensor& dst) = 0;
  // dst <- dst + src (fp32). REQUIRES: same number of elements.
  virtual absl::Status Add(const Tensor& src, Tensor& dst) = 0;
  // x <- scale · x (fp32).
  virtual absl::Status Scale(float scale, Tensor& x) = 0;

  // Σ x² accumulated in float64 over fixed-size blocks added in order, so the result does not
  // depend on the number of threads; and whether every element is finite.
  virtual absl::StatusOr<GradientStats> ComputeGradientStats(const Tensor& grad) = 0;
  // out ← f·x with f = fp32(1 / max(√s, eps)), s the Σ norm_of² of ComputeGradientStats (f
  // computed in float64 and rounded once; a NaN s gives a NaN f, an infinite one 0): the bits of
  // Axpby(f, x, 0, out) with f computed on the host, which this default does. A device overrides
  // it to keep s on the device, so that its queue need not wait for the host. `norm_of` may be
  // `x`, and `x` may be `out`. REQUIRES: fp32 tensors, x and out of one size, eps > 0.
  virtual absl::Status ScaleByInverseNorm(const Tensor& norm_of, float eps, const Tensor& x,
                                          Tensor& out);

  // y ← α·x + β·y (fp32, equal sizes). `x` may be `y`. With β == 0, y is not read.
  virtual absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y) = 0;
  // dst ← src converted element-wise (round to nearest even into bf16/fp16). One of the two is
  // fp32, the other any dtype; equal sizes.
  virtual absl::Status Convert(const Tensor& src, Tensor& dst) = 0;

  // C ← α·op(A)·op(B) + β·D: matrix().Gemm, or with `symmetric` matrix().SymmetricGemm, whose
  // β term is read from `d` instead of C, with the bits of Copy(d, c) followed by that product.
  // D has C's shape and dtype and may be C (then it is the product alone); A and B must not be C.
  // With β == 0, D is not read. The default runs the two; a device that can fold the copy into the
  // product's own pass overrides it (the CPU: one parallel region instead of two, which saves its
  // threads a sleep and a wake-up each; Newton–Schulz runs two such copies per step).
  virtual absl::Status GemmFrom(const GemmArgs& args, bool symmetric, const Tensor& a,
                                const Tensor& b, const Tensor& d, Tensor& c) {
    const absl::Status valid = internal::CheckGemmFrom(args, symmetric, a, b, d, c);
    if (!valid.ok()) return valid;  // before the copy: an invalid call changes nothing
    if (args.beta != 0.0f && d.data() != c.data()) {
      const absl::Status copied = Copy(d, c);
      if (!copied.ok()) return copied;
    }
    return symmetric ? matrix().SymmetricGemm(args, a, b, c) : matrix().Gemm(args, a, b, c);
  }

  // The optimizer updates of this device (kernels/update_kernels.h), owned by it.
  virtual UpdateKernels& updates() = 0;
  // The matrix primitives of this device (kernels/matrix_kernels.h), owned by it.
  virtual MatrixKernels& matrix() = 0;

  // Waits for all work queued on the device.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_H_
