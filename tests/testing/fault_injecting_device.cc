#include "tests/testing/fault_injecting_device.h"

#include <cstring>
#include <limits>
#include <utility>

#include "base/status_macros.h"
#include "glog/logging.h"

namespace optstep {
namespace testutil {
namespace {

// The methods of Device, UpdateKernels and MatrixKernels that answer a status, and those of them
// with an output to corrupt.
std::vector<std::string> CorruptibleMethods() {
  return {"Allocate",      "Zero",          "CopyFromHost",
          "AddFromHost",   "CopyToHost",    "Copy",
          "Add",           "Scale",         "ComputeGradientStats",
          "AdamW",         "Sgd",           "Lion",
          "MuonMomentum",  "Adamuon",       "NormuonMoment",
          "SoapAdam",      "Axpby",         "Gemm",
          "SymmetricGemm", "Convert",       "Transpose",
          "CopyRowBlocks", "AxisDot",       "AxisScale",
          "Permute",       "SymmetricEigh", "Qr"};
}

std::vector<std::string> CountedMethods() {
  std::vector<std::string> methods = CorruptibleMethods();
  methods.push_back("Synchronize");
  return methods;
}

}  // namespace

FaultInjectingDevice::FaultInjectingDevice(std::shared_ptr<Device> base)
    : base_(std::move(base)),
      faults_(CountedMethods(), CorruptibleMethods()),
      updates_(*this, base_->updates()),
      matrix_(*this, base_->matrix()) {}

template <typename Forward>
absl::Status FaultInjectingDevice::Run(const char* method, Tensor* output, Forward forward) {
  bool corrupt = false;
  OPTSTEP_RETURN_IF_ERROR(faults_.OnCall(method, &corrupt));
  OPTSTEP_RETURN_IF_ERROR(forward());
  return corrupt ? Corrupt(method, *output) : absl::OkStatus();
}

absl::Status FaultInjectingDevice::Corrupt(const char* method, Tensor& tensor) {
  CHECK(tensor.dtype() == DType::kF32) << "cannot corrupt the " << DTypeName(tensor.dtype())
                                       << " output of " << method << "; only fp32 outputs";
  if (tensor.numel() == 0) return absl::OkStatus();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return base_->CopyFromHost(&nan, DType::kF32, 1, tensor, 0);
}

std::string FaultInjectingDevice::name() const { return base_->name(); }

int64_t FaultInjectingDevice::allocated_bytes() const { return base_->allocated_bytes(); }
int64_t FaultInjectingDevice::memory_capacity() const { return base_->memory_capacity(); }

absl::StatusOr<Tensor> FaultInjectingDevice::Allocate(DType dtype, const Shape& shape) {
  Tensor tensor;
  OPTSTEP_RETURN_IF_ERROR(Run("Allocate", &tensor, [&]() -> absl::Status {
    OPTSTEP_ASSIGN_OR_RETURN(tensor, base_->Allocate(dtype, shape));
    return absl::OkStatus();
  }));
  return tensor;
}

absl::Status FaultInjectingDevice::Zero(Tensor& tensor) {
  return Run("Zero", &tensor, [&] { return base_->Zero(tensor); });
}

absl::Status FaultInjectingDevice::CopyFromHost(const void* src, DType src_dtype, int64_t count,
                                                Tensor& dst, int64_t dst_offset) {
  return Run("CopyFromHost", &dst,
             [&] { return base_->CopyFromHost(src, src_dtype, count, dst, dst_offset); });
}

absl::Status FaultInjectingDevice::AddFromHost(const void* src, DType src_dtype, int64_t count,
                                               Tensor& dst, int64_t dst_offset) {
  return Run("AddFromHost", &dst,
             [&] { return base_->AddFromHost(src, src_dtype, count, dst, dst_offset); });
}

absl::Status FaultInjectingDevice::CopyToHost(const Tensor& src, int64_t offset, int64_t count,
                                              DType dst_dtype, void* dst) {
  bool corrupt = false;
  OPTSTEP_RETURN_IF_ERROR(faults_.OnCall("CopyToHost", &corrupt));
  OPTSTEP_RETURN_IF_ERROR(base_->CopyToHost(src, offset, count, dst_dtype, dst));
  if (corrupt && count > 0) std::memset(dst, 0xff, DTypeSize(dst_dtype));
  return absl::OkStatus();
}

absl::Status FaultInjectingDevice::Copy(const Tensor& src, Tensor& dst) {
  return Run("Copy", &dst, [&] { return base_->Copy(src, dst); });
}

absl::Status FaultInjectingDevice::Add(const Tensor& src, Tensor& dst) {
  return Run("Add", &dst, [&] { return base_->Add(src, dst); });
}

absl::Status FaultInjectingDevice::Scale(float scale, Tensor& x) {
  return Run("Scale", &x, [&] { return base_->Scale(scale, x); });
}

absl::StatusOr<GradientStats> FaultInjectingDevice::ComputeGradientStats(const Tensor& grad) {
  bool corrupt = false;
  OPTSTEP_RETURN_IF_ERROR(faults_.OnCall("ComputeGradientStats", &corrupt));
  OPTSTEP_ASSIGN_OR_RETURN(GradientStats stats, base_->ComputeGradientStats(grad));
  if (corrupt) {
    stats.sum_squares = std::numeric_limits<double>::quiet_NaN();
    stats.all_finite = false;
  }
  return stats;
}

absl::Status FaultInjectingDevice::Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  return Run("Axpby", &y, [&] { return base_->Axpby(alpha, x, beta, y); });
}

absl::Status FaultInjectingDevice::Convert(const Tensor& src, Tensor& dst) {
  return Run("Convert", &dst, [&] { return base_->Convert(src, dst); });
}

absl::Status FaultInjectingDevice::Synchronize() {
  return Run("Synchronize", nullptr, [&] { return base_->Synchronize(); });
}

absl::Status FaultInjectingUpdateKernels::AdamW(const math::AdamWArgs& args, const Tensor& grad,
                                                Tensor& param, Tensor& exp_avg,
                                                Tensor& exp_avg_sq) {
  return device_.Run("AdamW", &param,
                     [&] { return base_.AdamW(args, grad, param, exp_avg, exp_avg_sq); });
}

absl::Status FaultInjectingUpdateKernels::Sgd(const math::SgdArgs& args, const Tensor& grad,
                                              Tensor& param, Tensor* momentum_buffer) {
  return device_.Run("Sgd", &param, [&] { return base_.Sgd(args, grad, param, momentum_buffer); });
}

absl::Status FaultInjectingUpdateKernels::Lion(const math::LionArgs& args, const Tensor& grad,
                                               Tensor& param, Tensor& exp_avg) {
  return device_.Run("Lion", &param, [&] { return base_.Lion(args, grad, param, exp_avg); });
}

absl::Status FaultInjectingUpdateKernels::MuonMomentum(const math::MuonMomentumArgs& args,
                                                       const Tensor& grad, Tensor& param,
                                                       Tensor& momentum, Tensor& update) {
  return device_.Run("MuonMomentum", &update,
                     [&] { return base_.MuonMomentum(args, grad, param, momentum, update); });
}

absl::Status FaultInjectingUpdateKernels::Adamuon(const math::Moment2Args& args,
                                                  const Tensor& update, Tensor& param,
                                                  Tensor& moment) {
  return device_.Run("Adamuon", &param, [&] { return base_.Adamuon(args, update, param, moment); });
}

absl::Status FaultInjectingUpdateKernels::NormuonMoment(const math::Moment2Args& args,
                                                        const Tensor& sum_squares, Tensor& moment,
                                                        Tensor& scale) {
  return device_.Run("NormuonMoment", &scale,
                     [&] { return base_.NormuonMoment(args, sum_squares, moment, scale); });
}

absl::Status FaultInjectingUpdateKernels::SoapAdam(const math::SoapAdamArgs& args,
                                                   const Tensor& grad, Tensor& exp_avg,
                                                   Tensor& exp_avg_sq, Tensor& direction) {
  return device_.Run("SoapAdam", &direction,
                     [&] { return base_.SoapAdam(args, grad, exp_avg, exp_avg_sq, direction); });
}

absl::Status FaultInjectingMatrixKernels::Gemm(const GemmArgs& args, const Tensor& a,
                                               const Tensor& b, Tensor& c) {
  return device_.Run("Gemm", &c, [&] { return base_.Gemm(args, a, b, c); });
}

absl::Status FaultInjectingMatrixKernels::SymmetricGemm(const GemmArgs& args, const Tensor& a,
                                                        const Tensor& b, Tensor& c) {
  return device_.Run("SymmetricGemm", &c, [&] { return base_.SymmetricGemm(args, a, b, c); });
}

absl::Status FaultInjectingMatrixKernels::Transpose(const Tensor& src, Tensor& dst) {
  return device_.Run("Transpose", &dst, [&] { return base_.Transpose(src, dst); });
}

absl::Status FaultInjectingMatrixKernels::CopyRowBlocks(const RowBlockCopy& copy, const Tensor& src,
                                                        Tensor& dst) {
  return device_.Run("CopyRowBlocks", &dst, [&] { return base_.CopyRowBlocks(copy, src, dst); });
}

absl::Status FaultInjectingMatrixKernels::AxisDot(const Tensor& a, const Tensor& b, Tensor& out) {
  return device_.Run("AxisDot", &out, [&] { return base_.AxisDot(a, b, out); });
}

absl::Status FaultInjectingMatrixKernels::AxisScale(const Tensor& v, Tensor& x) {
  return device_.Run("AxisScale", &x, [&] { return base_.AxisScale(v, x); });
}

absl::Status FaultInjectingMatrixKernels::Permute(const Tensor& src, int axis,
                                                  const std::vector<int64_t>& perm, Tensor& dst) {
  return device_.Run("Permute", &dst, [&] { return base_.Permute(src, axis, perm, dst); });
}

absl::Status FaultInjectingMatrixKernels::SymmetricEigh(const Tensor& a, float shift,
                                                        Tensor& eigenvalues, Tensor& eigenvectors) {
  return device_.Run("SymmetricEigh", &eigenvectors,
                     [&] { return base_.SymmetricEigh(a, shift, eigenvalues, eigenvectors); });
}

absl::Status FaultInjectingMatrixKernels::Qr(const Tensor& a, Tensor& q) {
  return device_.Run("Qr", &q, [&] { return base_.Qr(a, q); });
}

}  // namespace testutil
}  // namespace optstep
