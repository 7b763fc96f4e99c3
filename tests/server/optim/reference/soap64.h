#ifndef OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_SOAP64_H_
#define OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_SOAP64_H_

// Float64 reference of SOAP (spec §3.6.3), written from the spec: plain loops, LAPACK (double)
// for the eigendecomposition and QR. Test-only.

#include <cstdint>

#include "tests/server/optim/reference/matrix64.h"

namespace optstep {
namespace ref {

struct SoapSpec {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double shampoo_beta = 0.95;
  double eps = 1e-8;
  char decay_mode = 'd';  // 'd' decoupled, 'i' independent, 'l' l2, 'p' palm
  bool nesterov = false;
  int64_t frequency = 1;
  int64_t warmup = 0;
  bool correct_bias = true;
  bool correct_shampoo_beta_bias = true;
  bool kl = false;
  bool use_eigh = false;
  int64_t power_iter_steps = 1;
  bool adaptive = false;
  double tolerance = 1e-7;
  double max_update_rms = 0.0;
};

class Soap64 {
 public:
  Soap64(const SoapSpec& spec, int64_t m, int64_t n);

  // One step; returns the update U (before the learning rate) and applies p ← p − lr·U.
  Matrix Step(const Matrix& grad, double lr, double lambda, Matrix& p);

  const Matrix& left() const { return left_; }
  const Matrix& right() const { return right_; }
  const Matrix& q_left() const { return q_left_; }
  const Matrix& q_right() const { return q_right_; }
  const Matrix& exp_avg() const { return m_; }
  const Matrix& exp_avg_sq() const { return v_; }
  int64_t step() const { return step_; }

 private:
  void UpdateFactors(const Matrix& g, double beta);
  void Refresh(bool eigh);

  SoapSpec spec_;
  Matrix left_, right_, q_left_, q_right_, m_, v_;
  int64_t step_ = 0;
};

}  // namespace ref
}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_OPTIM_REFERENCE_SOAP64_H_
