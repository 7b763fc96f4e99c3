#ifndef OPTSTEP_TESTS_TESTING_FAULT_INJECTING_DEVICE_H_
#define OPTSTEP_TESTS_TESTING_FAULT_INJECTING_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "tests/testing/fault_injector.h"

namespace optstep {
namespace testutil {

class FaultInjectingDevice;

// The optimizer updates of a FaultInjectingDevice: each call goes through the device's faults under
// the method's name, then to the wrapped device's optimizer updates. Owned by the
// FaultInjectingDevice.
class FaultInjectingUpdateKernels final : public UpdateKernels {
 public:
  FaultInjectingUpdateKernels(FaultInjectingDevice& device, UpdateKernels& base)
      : device_(device), base_(base) {}

  FaultInjectingUpdateKernels(const FaultInjectingUpdateKernels&) = delete;
  FaultInjectingUpdateKernels& operator=(const FaultInjectingUpdateKernels&) = delete;

  absl::Status AdamW(const math::AdamWArgs& args, const Tensor& grad, Tensor& param,
                     Tensor& exp_avg, Tensor& exp_avg_sq) override;
  absl::Status Sgd(const math::SgdArgs& args, const Tensor& grad, Tensor& param,
                   Tensor* momentum_buffer) override;
  absl::Status Lion(const math::LionArgs& args, const Tensor& grad, Tensor& param,
                    Tensor& exp_avg) override;
  absl::Status MuonMomentum(const math::MuonMomentumArgs& args, const Tensor& grad, Tensor& param,
                            Tensor& momentum, Tensor& update) override;
  absl::Status Adamuon(const math::Moment2Args& args, const Tensor& update, Tensor& param,
                       Tensor& moment) override;
  absl::Status NormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                             Tensor& moment, Tensor& scale) override;
  absl::Status SoapAdam(const math::SoapAdamArgs& args, const Tensor& grad, Tensor& exp_avg,
                        Tensor& exp_avg_sq, Tensor& direction) override;

 private:
  FaultInjectingDevice& device_;
  UpdateKernels& base_;
};

// The matrix primitives of a FaultInjectingDevice: each call goes through the device's faults under
// the method's name, then to the wrapped device's matrix primitives. Owned by the
// FaultInjectingDevice.
class FaultInjectingMatrixKernels final : public MatrixKernels {
 public:
  FaultInjectingMatrixKernels(FaultInjectingDevice& device, MatrixKernels& base)
      : device_(device), base_(base) {}

  FaultInjectingMatrixKernels(const FaultInjectingMatrixKernels&) = delete;
  FaultInjectingMatrixKernels& operator=(const FaultInjectingMatrixKernels&) = delete;

  absl::Status Gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) override;
  absl::Status SymmetricGemm(const GemmArgs& args, const Tensor& a, const Tensor& b,
                             Tensor& c) override;
  absl::Status Transpose(const Tensor& src, Tensor& dst) override;
  absl::Status CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src, Tensor& dst) override;
  absl::Status AxisDot(const Tensor& a, const Tensor& b, Tensor& out) override;
  absl::Status AxisScale(const Tensor& v, Tensor& x) override;
  absl::Status Permute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                       Tensor& dst) override;
  absl::Status SymmetricEigh(const Tensor& a, float shift, Tensor& eigenvalues,
                             Tensor& eigenvectors) override;
  absl::Status Qr(const Tensor& a, Tensor& q) override;

 private:
  FaultInjectingDevice& device_;
  MatrixKernels& base_;
};

// A Device that forwards every call to another Device and injects the faults set in faults()
// (fail the n-th call of a method, delay it, corrupt its output), so that tests reach the
// engine's failure branches (LevelDB's ErrorEnv, for a device). The device's updates() and
// matrix() wrap those of the wrapped device the same way. Methods are named as in
// kernels/device.h, kernels/update_kernels.h and kernels/matrix_kernels.h ("CopyFromHost",
// "ComputeGradientStats", "AdamW", "Gemm", "SymmetricGemm", ...); every method that answers a
// status is counted and can be failed or delayed (name(), allocated_bytes() and memory_capacity()
// are only forwarded).
//
// Corruption happens after a successful call: the first element of the method's output becomes
// NaN (written through the wrapped device, so it works in any device memory); for CopyToHost
// every byte of the first host element becomes 0xff (a NaN in fp32, bf16 and fp16); for
// ComputeGradientStats the statistics say "not finite" with a NaN sum. An output that is not fp32
// (Convert to bf16, a bf16 Gemm) cannot be corrupted: the process aborts naming the method.
// Synchronize has no output.
//
// Thread safety: as the wrapped device; faults() may be changed from any thread at any time.
class FaultInjectingDevice final : public Device {
 public:
  explicit FaultInjectingDevice(std::shared_ptr<Device> base);

  FaultInjectingDevice(const FaultInjectingDevice&) = delete;
  FaultInjectingDevice& operator=(const FaultInjectingDevice&) = delete;

  FaultInjector& faults() { return faults_; }
  Device& base() { return *base_; }

  std::string name() const override;
  absl::StatusOr<Tensor> Allocate(DType dtype, const Shape& shape) override;
  int64_t allocated_bytes() const override;
  int64_t memory_capacity() const override;
  absl::Status Zero(Tensor& tensor) override;
  absl::Status CopyFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                            int64_t dst_offset) override;
  absl::Status AddFromHost(const void* src, DType src_dtype, int64_t count, Tensor& dst,
                           int64_t dst_offset) override;
  absl::Status CopyToHost(const Tensor& src, int64_t offset, int64_t count, DType dst_dtype,
                          void* dst) override;
  absl::Status Copy(const Tensor& src, Tensor& dst) override;
  absl::Status Add(const Tensor& src, Tensor& dst) override;
  absl::Status Scale(float scale, Tensor& x) override;
  absl::StatusOr<GradientStats> ComputeGradientStats(const Tensor& grad) override;
  absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y) override;
  absl::Status Convert(const Tensor& src, Tensor& dst) override;
  UpdateKernels& updates() override { return updates_; }
  MatrixKernels& matrix() override { return matrix_; }
  absl::Status Synchronize() override;

 private:
  friend class FaultInjectingUpdateKernels;
  friend class FaultInjectingMatrixKernels;

  // Counts the call, applies its faults around `forward` and corrupts `output` when told to.
  template <typename Forward>
  absl::Status Run(const char* method, Tensor* output, Forward forward);
  // Writes a NaN into the first element of the fp32 `tensor`.
  absl::Status Corrupt(const char* method, Tensor& tensor);

  const std::shared_ptr<Device> base_;
  FaultInjector faults_;
  FaultInjectingUpdateKernels updates_;
  FaultInjectingMatrixKernels matrix_;
};

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_FAULT_INJECTING_DEVICE_H_
