#include "kernels/emerging_validation.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device_validation.h"
#include "base/status_macros.h"

namespace optstep {
namespace internal {
namespace {

using NamedTensor = std::pair<const char*, const Tensor*>;

// Every tensor fp32 and of the first one's size; all pairwise distinct.
absl::Status CheckTensors(absl::string_view op, const std::vector<NamedTensor>& tensors) {
  for (const NamedTensor& t : tensors) OPTSTEP_RETURN_IF_ERROR(CheckF32(op, t.first, *t.second));
  for (size_t i = 1; i < tensors.size(); ++i) {
    OPTSTEP_RETURN_IF_ERROR(CheckSameSize(op, tensors[i].first, *tensors[i].second,
                                          tensors[0].first, *tensors[0].second));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (size_t j = i + 1; j < tensors.size(); ++j) {
      OPTSTEP_RETURN_IF_ERROR(CheckDistinct(op, tensors[i].first, *tensors[i].second,
                                            tensors[j].first, *tensors[j].second));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(absl::string_view op, const char* name, float beta, const char* one_minus,
                       float one_minus_beta) {
  OPTSTEP_RETURN_IF_ERROR(CheckArgRange(op, name, beta, 0.0f, true, 1.0f, false));
  return CheckArgRange(op, one_minus, one_minus_beta, 0.0f, false, 1.0f, true);
}

absl::Status CheckFinite(absl::string_view op, const char* name, float value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be finite, got ", value));
}

}  // namespace

absl::Status CheckLion(const math::LionArgs& a, const Tensor& grad, const Tensor& param,
                       const Tensor& exp_avg) {
  constexpr absl::string_view kOp = "Lion";
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "lr", a.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckBeta(kOp, "beta1", a.beta1, "one_minus_beta1", a.one_minus_beta1));
  OPTSTEP_RETURN_IF_ERROR(CheckBeta(kOp, "beta2", a.beta2, "one_minus_beta2", a.one_minus_beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "decay coefficient", a.decay.coef));
  OPTSTEP_RETURN_IF_ERROR(CheckArgRange(kOp, "grad_scale", a.grad_scale, 0.0f, false, 1.0f, true));
  return CheckTensors(kOp, {{"grad", &grad}, {"param", &param}, {"exp_avg", &exp_avg}});
}

absl::Status CheckMuonMomentum(const math::MuonMomentumArgs& a, const Tensor& grad,
                               const Tensor& param, const Tensor& momentum, const Tensor& update) {
  constexpr absl::string_view kOp = "MuonMomentum";
  OPTSTEP_RETURN_IF_ERROR(
      CheckBeta(kOp, "momentum", a.momentum, "one_minus_momentum", a.one_minus_momentum));
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "decay coefficient", a.decay.coef));
  return CheckTensors(
      kOp, {{"grad", &grad}, {"param", &param}, {"momentum", &momentum}, {"update", &update}});
}

absl::Status CheckMoment2Args(absl::string_view op, const math::Moment2Args& a) {
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(op, "lr", a.lr));
  OPTSTEP_RETURN_IF_ERROR(CheckBeta(op, "beta2", a.beta2, "one_minus_beta2", a.one_minus_beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(op, "eps", a.eps));
  return CheckArgRange(op, "count", a.count, 1.0f, true, std::numeric_limits<float>::infinity(),
                       false);
}

absl::Status CheckAdamuon(const math::Moment2Args& args, const Tensor& update, const Tensor& param,
                          const Tensor& moment) {
  OPTSTEP_RETURN_IF_ERROR(CheckMoment2Args("Adamuon", args));
  return CheckTensors("Adamuon", {{"update", &update}, {"param", &param}, {"moment", &moment}});
}

absl::Status CheckNormuonMoment(const math::Moment2Args& args, const Tensor& sum_squares,
                                const Tensor& moment, const Tensor& scale) {
  OPTSTEP_RETURN_IF_ERROR(CheckMoment2Args("NormuonMoment", args));
  OPTSTEP_RETURN_IF_ERROR(
      CheckTensors("NormuonMoment", {{"sum_squares", &sum_squares}, {"moment", &moment}}));
  OPTSTEP_RETURN_IF_ERROR(
      CheckTensors("NormuonMoment", {{"sum_squares", &sum_squares}, {"scale", &scale}}));
  return CheckDistinct("NormuonMoment", "moment", moment, "scale", scale);
}

absl::Status CheckSoapAdam(const math::SoapAdamArgs& a, const Tensor& grad, const Tensor& exp_avg,
                           const Tensor& exp_avg_sq, const Tensor& direction) {
  constexpr absl::string_view kOp = "SoapAdam";
  OPTSTEP_RETURN_IF_ERROR(CheckBeta(kOp, "beta1", a.beta1, "one_minus_beta1", a.one_minus_beta1));
  OPTSTEP_RETURN_IF_ERROR(CheckBeta(kOp, "beta2", a.beta2, "one_minus_beta2", a.one_minus_beta2));
  OPTSTEP_RETURN_IF_ERROR(CheckArgNonNegative(kOp, "eps", a.eps));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "bias_correction1", a.bias_correction1, 0.0f, false, 1.0f, true));
  OPTSTEP_RETURN_IF_ERROR(
      CheckArgRange(kOp, "bias_correction2", a.bias_correction2, 0.0f, false, 1.0f, true));
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "nesterov_momentum_coef", a.nesterov_momentum_coef));
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "nesterov_grad_coef", a.nesterov_grad_coef));
  return CheckTensors(kOp, {{"grad", &grad},
                            {"exp_avg", &exp_avg},
                            {"exp_avg_sq", &exp_avg_sq},
                            {"direction", &direction}});
}

absl::Status CheckAxpby(float alpha, const Tensor& x, float beta, const Tensor& y) {
  constexpr absl::string_view kOp = "Axpby";
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "alpha", alpha));
  OPTSTEP_RETURN_IF_ERROR(CheckFinite(kOp, "beta", beta));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "x", x));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "y", y));
  return CheckSameSize(kOp, "y", y, "x", x);
}

}  // namespace internal
}  // namespace optstep
