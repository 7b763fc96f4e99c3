#ifndef OPTSTEP_SERVER_OPTIM_PRESETS_H_
#define OPTSTEP_SERVER_OPTIM_PRESETS_H_

// Megatron-parity presets (spec Appendix A): `--optimizer X` as a chain, with Megatron-style
// argument names overriding preset values.
//
//   adam           AdamW (0.9, 0.999), eps 1e-8, wd 0.01 for every parameter
//   sgd            SGD momentum 0.9, coupled wd 0.01 for every parameter
//   muon           Muon μ 0.9, no Nesterov, decoupled wd 0.01, quintic×5, spectral, κ 1, medium,
//                  split QKV (dist_muon: deprecated alias)
//   adaptive_muon  as muon + adamuon, β2 0.95, ε 1e-8
//   soap           SOAP betas (0.9, 0.999), β_s 0.95, ε 1e-8, wd 0.01, F 1, W 0, KL on,
//                  high/high, eigh only at the first refresh, no RMS clip
//   lion           Lion betas (0.9, 0.999), decoupled wd 0.01
// The emerging presets chain [X, adam]: 2-D parameters not flagged embedding/output go to X, the
// rest to Adam (as the adam preset); wd_mult 0 for 1-D and *.bias parameters (spec §4).
// Global: clip_grad 1.0.
//
// Arguments (values are text; numbers as in C, booleans true/false/1/0):
//   every preset   lr, weight_decay (every sub-optimizer), clip_grad
//   adam part      adam_beta1, adam_beta2, adam_eps
//   sgd            sgd_momentum
//   muon, adaptive_muon   muon_momentum, muon_nesterov, muon_coefficient_type,
//                  muon_num_ns_steps, muon_scale_mode, muon_extra_scale_factor,
//                  muon_fp32_matmul_prec, muon_split_qkv, muon_tp_mode (blockwise, duplicated or
//                  distributed: accepted, no effect: optstep orthogonalizes whole matrices)
//   adaptive_muon  adaptive_muon_moment2_method, adaptive_muon_beta2, adaptive_muon_eps
//   soap           soap_beta1, soap_beta2 (default: adam_beta1/2, as Megatron), soap_shampoo_beta,
//                  soap_eps, soap_precondition_frequency, soap_warmup_steps, soap_use_kl_shampoo,
//                  soap_correct_bias, soap_correct_shampoo_beta_bias, soap_nesterov,
//                  soap_fp32_matmul_prec, soap_qr_fp32_matmul_prec, soap_use_eigh,
//                  soap_power_iter_steps, soap_use_adaptive_criteria,
//                  soap_adaptive_update_tolerance, soap_max_update_rms
//   lion           lion_beta1, lion_beta2 (default: adam_beta1/2, as Megatron's CLI)
//   emerging presets  scalar_optimizer: adam (default) or lion for the non-matrix parameters
//                  (Megatron accepts and ignores it; optstep applies it, spec §4)
//   every preset   apply_wd_to_qk_layernorm: q/k layer-norm weights (names matching
//                  *q_layernorm* / *k_layernorm*) keep wd_mult 1 (spec §4)
// Values are validated when the chain is routed (INVALID_ARGUMENT naming the sub-optimizer).

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "server/optim/optimizer_config.h"

namespace optstep {

// INVALID_ARGUMENT for unknown presets and for unknown, misplaced or unparsable arguments
// (naming them).
absl::StatusOr<ChainConfig> ExpandPreset(const std::string& preset,
                                         const std::map<std::string, std::string>& args);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_PRESETS_H_
