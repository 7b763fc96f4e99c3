#ifndef OPTSTEP_KERNELS_DEVICE_H_
#define OPTSTEP_KERNELS_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"

namespace optstep {

// Result of one pass over a gradient: the sum of squares for the global norm and whether every
// element is finite.
struct GradientStats {
  double sum_squares = 0.0;
  bool all_finite = true;
};

// Runs memory management, dtype conversion and optimizer updates on one device.
// Implementations: CpuDevice (always built) and CudaDevice (--config=cuda).
//
// Thread safety: CopyFromHost and CopyToHost may be called concurrently from several threads when
// their device ranges do not overlap a tensor being updated; every other method is
// thread-compatible, and the engine's per-device worker serialises those calls.
//
// Every method validates its arguments on the host before touching memory and answers
// INVALID_ARGUMENT (mismatched sizes, ranges, dtypes) without side effects. Tensors passed to
// updates are fp32. Errors reported by the device library after validation are INTERNAL.
//
// Matrices are row-major 2-D tensors (shape {rows, cols}). Unless a method says otherwise, its
// output may not alias an input (INVALID_ARGUMENT when the data pointers are equal).
class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:<ordinal>".
  virtual std::string name() const = 0;

  // A zero-filled tensor. RESOURCE_EXHAUSTED when the memory cannot be had.
  virtual absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) = 0;
  // Bytes currently held by tensors of this device.
  virtual int64_t allocated_bytes() const = 0;

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
  virtual absl::Status CopyToHost(const Tensor& src, int64_t offset, int64_t count,
                                  DType dst_dtype, void* dst) = 0;

  // dst <- src. REQUIRES: same dtype and number of elements.
  virtual absl::Status Copy(const Tensor& src, Tensor& dst) = 0;
  // dst <- dst + src (fp32). REQUIRES: same number of elements.
  virtual absl::Status Add(const Tensor& src, Tensor& dst) = 0;
  // x <- scale · x (fp32).
  virtual absl::Status Scale(float scale, Tensor& x) = 0;

  // Σ x² accumulated in float64 over fixed-size blocks added in order, so the result does not
  // depend on the number of threads; and whether every element is finite.
  virtual absl::StatusOr<GradientStats> ComputeGradientStats(const Tensor& grad) = 0;

  // Adam / AdamW (spec §3.1) on every element.
  // REQUIRES: grad, param, exp_avg, exp_avg_sq have the same number of elements.
  virtual absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                             Tensor& exp_avg, Tensor& exp_avg_sq) = 0;
  // SGD (spec §3.2). `momentum_buffer` may be null when args.momentum == 0.
  virtual absl::Status Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                           Tensor* momentum_buffer) = 0;

  // ---- element-wise parts of the emerging optimizers (formulas: kernels/math/emerging.h) ----

  // Lion (spec §3.3). REQUIRES: grad, param, exp_avg fp32 of equal size, distinct.
  virtual absl::Status Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                            Tensor& exp_avg) = 0;
  // Muon weight decay and EMA momentum (spec §3.4.2): updates param and momentum, writes the
  // matrix to orthogonalize into `update`. REQUIRES: four fp32 tensors of equal size, distinct.
  virtual absl::Status MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad,
                                    Tensor& param, Tensor& momentum, Tensor& update) = 0;
  // AdaptiveMuon "adamuon" (spec §3.5): v ← β2·v + (1−β2)·O², p ← p − η·O/(√v + ε).
  virtual absl::Status Adamuon(const math::Moment2Args& args, const Tensor& update, Tensor& param,
                               Tensor& moment) = 0;
  // AdaptiveMuon "normuon" moment (spec §3.5), per entry of the (m,1) or (1,n) moment:
  // v ← β2·v + (1−β2)·sum_squares/count; scale ← 1/√max(v, ε).
  // REQUIRES: three fp32 tensors of equal size; `scale` distinct from the others.
  virtual absl::Status NormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                                     Tensor& moment, Tensor& scale) = 0;
  // SOAP's Adam in the rotated basis (spec §3.6.3 S5): updates exp_avg, exp_avg_sq and writes the
  // normalized direction into `direction`. REQUIRES: four fp32 tensors of equal size, distinct.
  virtual absl::Status SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad,
                                Tensor& exp_avg, Tensor& exp_avg_sq, Tensor& direction) = 0;
  // y ← α·x + β·y (fp32, equal sizes). `x` may be `y`. With β == 0, y is not read.
  virtual absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y) = 0;

  // ---- matrix primitives ----------------------------------------------------------------------

  // C ← α·op(A)·op(B) + β·C (kernels/matrix_types.h). A, B, C are 2-D with matching shapes and
  // all fp32, or all bf16 (then args.precision must be kMedium). C may not alias A or B.
  virtual absl::Status Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                            Tensor& c) = 0;
  // dst ← src converted element-wise (round to nearest even into bf16/fp16). One of the two is
  // fp32, the other any dtype; equal sizes.
  virtual absl::Status Convert(const Tensor& src, Tensor& dst) = 0;
  // dst ← srcᵀ. REQUIRES: src fp32 {m, n}, dst fp32 {n, m}.
  virtual absl::Status Transpose(const Tensor& src, Tensor& dst) = 0;
  // Strided row-block copy between fp32 matrices of the same width; every range inside.
  virtual absl::Status CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src,
                                     Tensor& dst) = 0;
  // out ← Σ a⊙b along one axis, keeping it (numpy keepdims): `out` of shape {m, 1} sums each row,
  // {1, n} each column. Accumulated in float64 in index order, rounded to fp32 once.
  // REQUIRES: a, b fp32 of the same 2-D shape (b may be a); out fp32, distinct.
  virtual absl::Status AxisDot(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // x ← x ⊙ v, broadcast: `v` of shape {m, 1} scales rows, {1, n} columns of the fp32 {m, n} x.
  virtual absl::Status AxisScale(const Tensor& v, Tensor& x) = 0;
  // dst ← src with its rows (axis 0: dst[i, :] = src[perm[i], :]) or columns (axis 1:
  // dst[:, j] = src[:, perm[j]]) permuted. REQUIRES: fp32 matrices of the same shape; `perm` a
  // permutation of [0, size of the axis).
  virtual absl::Status Permute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                               Tensor& dst) = 0;
  // Eigen-decomposition of the symmetric fp32 {n, n} matrix `a` for SOAP (spec §3.6.3 "eigh
  // details"): the solver factors a + shift·I (only the upper triangle is read); columns of
  // `eigenvectors` {n, n} are unit eigenvectors ordered by descending eigenvalue, `eigenvalues`
  // {n} the eigenvalues of `a` (the shift subtracted). When `a` is exactly diagonal (every
  // off-diagonal entry zero) no solver runs: the eigenvectors are identity columns in the stable
  // descending order of the diagonal. When the fp32 solver fails it is retried in fp64.
  virtual absl::Status SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                                     Tensor& eigenvectors) = 0;
  // q ← the orthonormal factor of a Householder QR of the fp32 {m, n} matrix a, m ≥ n (thin Q,
  // {m, n}). Column signs are the solver's.
  virtual absl::Status Qr(const Tensor& a, Tensor& q) = 0;

  // Waits for all work queued on the device.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_H_
