#include "server/optim/newton_schulz.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

// Workspace slots.
enum Slot : int { kNormalized = 0, kX = 1, kY = 2, kA = 3, kB = 4 };

std::vector<NsCoefficients> Rows(std::initializer_list<std::array<double, 3>> rows) {
  std::vector<NsCoefficients> out;
  for (const auto& r : rows) {
    out.push_back({static_cast<float>(r[0]), static_cast<float>(r[1]), static_cast<float>(r[2])});
  }
  return out;
}

const std::map<CoefficientType, std::vector<NsCoefficients>>& Tables() {
  static const auto* tables = new std::map<CoefficientType, std::vector<NsCoefficients>>{
      {CoefficientType::kSimple, Rows({{3.4445, -4.7750, 2.0315}})},
      {CoefficientType::kQuintic, Rows({{4.0848, -6.8946, 2.9270},
                                        {3.9505, -6.3029, 2.6377},
                                        {3.7418, -5.5913, 2.3037},
                                        {2.8769, -3.1427, 1.2046},
                                        {2.8366, -3.0525, 1.2012}})},
      {CoefficientType::kPolarExpress, Rows({{8.2051, -22.9019, 16.4607},
                                             {4.0664, -2.8612, 0.5184},
                                             {3.9096, -2.8234, 0.5250},
                                             {3.2856, -2.4153, 0.4853},
                                             {2.2779, -1.6198, 0.3985},
                                             {1.8726, -1.2307, 0.3585},
                                             {1.8564, -1.2132, 0.3568},
                                             {1.8750, -1.2500, 0.3750}})},
      {CoefficientType::kAol, Rows({{4.0098, -7.0585, 2.4635},
                                    {3.4585, -5.5479, 2.5959},
                                    {2.7573, -3.2939, 1.4254},
                                    {2.7215, -3.0494, 1.3169}})},
  };
  return *tables;
}

constexpr std::pair<CoefficientType, absl::string_view> kNames[] = {
    {CoefficientType::kSimple, "simple"},
    {CoefficientType::kQuintic, "quintic"},
    {CoefficientType::kPolarExpress, "polar_express"},
    {CoefficientType::kAol, "aol"},
    {CoefficientType::kCustom, "custom"},
};

}  // namespace

absl::StatusOr<CoefficientType> ParseCoefficientType(absl::string_view owner,
                                                     absl::string_view name) {
  for (const auto& [type, type_name] : kNames) {
    if (name == type_name) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": coefficient_type '", name,
                   "' is not one of simple, quintic, polar_express, aol, custom"));
}

absl::string_view CoefficientTypeName(CoefficientType type) {
  for (const auto& [t, name] : kNames) {
    if (t == type) return name;
  }
  return "unknown";
}

const std::vector<NsCoefficients>& CoefficientTable(CoefficientType type) {
  return Tables().at(type);
}

NsCoefficients CoefficientsForStep(const NewtonSchulzOptions& options, int64_t k) {
  const std::vector<NsCoefficients>& table =
      options.type == CoefficientType::kCustom ? options.custom : CoefficientTable(options.type);
  const int64_t n = static_cast<int64_t>(table.size());
  if (options.type == CoefficientType::kPolarExpress) return table[std::min(k, n - 1)];
  return table[k % n];
}

double NewtonSchulz::Flops(int64_t rows, int64_t cols, int64_t steps) {
  const double r = static_cast<double>(std::min(rows, cols));
  const double c = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * r * r * c + 2.0 * r * r * r);
}

void NewtonSchulz::PlanWorkspace(int64_t rows, int64_t cols, WorkspacePlan& plan) const {
  const int64_t r = std::min(rows, cols);
  const int64_t c = std::max(rows, cols);
  const bool medium = options_.precision == MatmulPrecision::kMedium;
  const DType work = medium ? DType::kBF16 : DType::kF32;
  plan.Need(kNormalized, DType::kF32, {r, c});
  if (medium) plan.Need(kX, work, {r, c});
  plan.Need(kY, work, {r, c});
  plan.Need(kA, work, {r, r});
  plan.Need(kB, work, {r, r});
}

absl::Status NewtonSchulz::Run(Device& device, const Tensor& x, Tensor& out) {
  if (x.ndim() != 2 || out.shape() != x.shape() || x.dtype() != DType::kF32 ||
      out.dtype() != DType::kF32 || x.data() == out.data()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NewtonSchulz: needs distinct fp32 matrices "
                     "of one shape, got ",
                     ShapeString(x.shape()), " and ", ShapeString(out.shape())));
  }
  const bool transpose = x.dim(0) > x.dim(1);
  const int64_t r = std::min(x.dim(0), x.dim(1));
  const int64_t c = std::max(x.dim(0), x.dim(1));
  const bool medium = options_.precision == MatmulPrecision::kMedium;
  const DType work = medium ? DType::kBF16 : DType::kF32;

  // 1-2. Transpose rule and normalization (fp32) by 1 / max(‖x‖_F, eps); the norm stays on the
  // device (a GPU's queue does not wait for the host).
  OPTSTEP_ASSIGN_OR_RETURN(Tensor normalized,
                           workspace_.Get(device, kNormalized, DType::kF32, {r, c}));
  if (transpose) {
    OPTSTEP_RETURN_IF_ERROR(device.matrix().Transpose(x, normalized));
    OPTSTEP_RETURN_IF_ERROR(device.ScaleByInverseNorm(x, options_.eps, normalized, normalized));
  } else {
    OPTSTEP_RETURN_IF_ERROR(device.ScaleByInverseNorm(x, options_.eps, x, normalized));
  }
  // 3. kMedium: the loop runs on bf16 tensors.
  Tensor X;
  if (medium) {
    OPTSTEP_ASSIGN_OR_RETURN(X, workspace_.Get(device, kX, work, {r, c}));
    OPTSTEP_RETURN_IF_ERROR(device.Convert(normalized, X));
  } else {
    X = Tensor(DType::kF32, {r, c}, normalized.data(), Tensor::Deleter());
  }
  OPTSTEP_ASSIGN_OR_RETURN(Tensor Y, workspace_.Get(device, kY, work, {r, c}));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor A, workspace_.Get(device, kA, work, {r, r}));
  OPTSTEP_ASSIGN_OR_RETURN(Tensor B, workspace_.Get(device, kB, work, {r, r}));

  // 4. The iteration. X·Xᵀ and A·A (A symmetric) are symmetric: SymmetricGemm. The β terms b·A
  // and a·X are read from A and X (GemmFrom), so that a device folds their copies into B and Y
  // into the products' own passes.
  const MatmulPrecision precision = options_.precision;
  for (int64_t k = 0; k < options_.num_steps; ++k) {
    const NsCoefficients co = CoefficientsForStep(options_, k);
    OPTSTEP_RETURN_IF_ERROR(
        device.matrix().SymmetricGemm({precision, false, true, 1.0f, 0.0f}, X, X, A));  // X·Xᵀ
    OPTSTEP_RETURN_IF_ERROR(device.GemmFrom({precision, false, false, co.c, co.b},
                                            /*symmetric=*/true, A, A, A, B));  // b·A + c·A·A
    OPTSTEP_RETURN_IF_ERROR(device.GemmFrom({precision, false, false, 1.0f, co.a},
                                            /*symmetric=*/false, B, X, X, Y));  // a·X + B·X
    std::swap(X, Y);
  }

  // 5. Back to fp32; undo the transpose.
  if (medium) {
    if (!transpose) return device.Convert(X, out);
    OPTSTEP_RETURN_IF_ERROR(device.Convert(X, normalized));
    return device.matrix().Transpose(normalized, out);
  }
  return transpose ? device.matrix().Transpose(X, out) : device.Copy(X, out);
}

}  // namespace optstep
