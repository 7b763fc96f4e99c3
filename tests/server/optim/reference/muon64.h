#ifndef OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MUON64_H_
#define OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MUON64_H_

// Float64 reference of Newton–Schulz, Muon and AdaptiveMuon (spec §3.4-3.5), written from the
// spec with plain loops. Test-only.

#include <cstdint>
#include <string>
#include <vector>

#include "tests/server/optim/reference/matrix64.h"

namespace optstep {
namespace ref {

struct Coefficients {
  double a, b, c;
};

// The spec's table `name` (simple, quintic, polar_express, aol), each value rounded to fp32 as
// the implementation uses it.
std::vector<Coefficients> SpecTable(const std::string& name);

// NS(x) of spec §3.4.3: transpose iff rows > cols, X / max(‖X‖_F, eps), `steps` polynomial
// steps (row k mod len, or min(k, len − 1) with `repeat_last`), transpose back.
Matrix NewtonSchulz(const Matrix& x, const std::vector<Coefficients>& table, bool repeat_last,
                    int steps, double eps = 1e-7);

// f(σ): the composition of the per-step polynomials applied to a normalized singular value.
double ComposedPolynomial(double sigma, const std::vector<Coefficients>& table, bool repeat_last,
                          int steps);

// s(rows, cols) of spec §3.4.4 ("spectral", "shape_scaling", "unit_rms_norm").
double ScaleFactor(const std::string& mode, int64_t rows, int64_t cols);

// Weight decay of spec §2: 'd' decoupled, 'i' independent, 'l' l2, 'p' palm.
struct MuonSpec {
  double momentum = 0.95;
  bool nesterov = false;
  char decay_mode = 'd';
  std::vector<Coefficients> table = SpecTable("quintic");
  bool repeat_last = false;
  int steps = 5;
  std::string scale_mode = "spectral";
  double kappa = 1.0;
  // Fused QKV: rows per query group of Q, K, V (0: not split).
  int64_t q_rows = 0;
  int64_t kv_rows = 0;
  bool identity = false;  // O = u (no NS, no scale)
};

class Muon64 {
 public:
  Muon64(MuonSpec spec, int64_t rows, int64_t cols)
      : spec_(std::move(spec)), momentum_(rows, cols) {}

  // Decay and momentum; returns O = NS(u)·s·κ (per component when split).
  Matrix Orthogonalized(const Matrix& grad, double lr, double lambda, Matrix& p);
  // p ← p − lr·O.
  void Step(const Matrix& grad, double lr, double lambda, Matrix& p);

  const Matrix& momentum() const { return momentum_; }
  const MuonSpec& spec() const { return spec_; }

 private:
  Matrix OrthogonalizeOne(const Matrix& u) const;

  MuonSpec spec_;
  Matrix momentum_;
};

class AdaptiveMuon64 {
 public:
  // `normuon` false: adamuon.
  AdaptiveMuon64(MuonSpec spec, int64_t rows, int64_t cols, bool normuon, double beta2, double eps);

  void Step(const Matrix& grad, double lr, double lambda, Matrix& p);

  const Matrix& moment() const { return moment_; }

 private:
  Muon64 muon_;
  bool normuon_;
  double beta2_, eps_;
  Matrix moment_;
};

}  // namespace ref
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_MUON64_H_
