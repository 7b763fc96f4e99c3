#ifndef OPTSTEP_SERVER_OPTIM_NEWTON_SCHULZ_H_
#define OPTSTEP_SERVER_OPTIM_NEWTON_SCHULZ_H_

// Newton–Schulz orthogonalization of Muon (docs/spec/optimizers.md §3.4.3) over kernels::Device:
//
//   transpose iff rows > cols; X ← X / max(‖X‖_F, eps); under kMedium cast X to bf16 and run the
//   whole loop on bf16 tensors; per step (a, b, c): A ← X·Xᵀ; B ← b·A + c·A·A; X ← a·X + B·X
//   (the b·A and a·X terms are the GEMMs' β epilogues, read from A and X by Device::GemmFrom);
//   cast to fp32; undo the transpose.
//   A and B are symmetric: MatrixKernels::SymmetricGemm (on the CPU, only the entries on and above
//   the diagonal are multiplied, then mirrored).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/device.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"
#include "server/optim/workspace.h"

namespace optstep {

enum class CoefficientType { kSimple, kQuintic, kPolarExpress, kAol, kCustom };

// One step's polynomial φ(σ) = a·σ + b·σ³ + c·σ⁵, as fp32 scalars.
struct NsCoefficients {
  float a = 0.0f;
  float b = 0.0f;
  float c = 0.0f;
};

struct NewtonSchulzOptions {
  CoefficientType type = CoefficientType::kQuintic;
  std::vector<NsCoefficients> custom;  // the rows of kCustom (cycled)
  int64_t num_steps = 5;
  float eps = 1e-7f;  // Frobenius-norm floor
  MatmulPrecision precision = MatmulPrecision::kMedium;
};

// "simple", "quintic", "polar_express", "aol", "custom"; otherwise INVALID_ARGUMENT naming
// `owner` and the value.
absl::StatusOr<CoefficientType> ParseCoefficientType(absl::string_view owner,
                                                     absl::string_view name);
absl::string_view CoefficientTypeName(CoefficientType type);

// The rows of a built-in table (spec §3.4.3), rounded to fp32. REQUIRES: type != kCustom.
const std::vector<NsCoefficients>& CoefficientTable(CoefficientType type);

// The coefficients of 0-based step `k`: polar_express repeats its last row, every other table
// (and custom) cycles. REQUIRES: the table is not empty.
NsCoefficients CoefficientsForStep(const NewtonSchulzOptions& options, int64_t k);

// Runs NS on one device. Owns its scratch tensors (Workspace): 2 matrices of the input's size in
// the work dtype, 1 in fp32 and 2 of min(m, n)² in the work dtype. Thread-compatible.
class NewtonSchulz {
 public:
  // REQUIRES: `options` validated (num_steps >= 1, a custom table non-empty, eps > 0).
  explicit NewtonSchulz(NewtonSchulzOptions options) : options_(std::move(options)) {}

  // out ← NS(x). x and out: fp32 matrices of the same shape, distinct (INVALID_ARGUMENT
  // otherwise). A zero input gives a zero output.
  absl::Status Run(Device& device, const Tensor& x, Tensor& out);

  const NewtonSchulzOptions& options() const { return options_; }

  // The scratch of Run on a rows×cols matrix (see Workspace, WorkspacePlan).
  void PlanWorkspace(int64_t rows, int64_t cols, WorkspacePlan& plan) const;

  // Floating-point operations of one run on a rows×cols matrix (spec §6):
  // steps·(4·r²·c + 2·r³), r = min, c = max.
  static double Flops(int64_t rows, int64_t cols, int64_t steps);

 private:
  NewtonSchulzOptions options_;
  Workspace workspace_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_NEWTON_SCHULZ_H_
