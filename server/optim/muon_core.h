#ifndef OPTSTEP_SERVER_OPTIM_MUON_CORE_H_
#define OPTSTEP_SERVER_OPTIM_MUON_CORE_H_

// The part of a step that Muon (spec §3.4) and AdaptiveMuon (§3.5) share:
//
//   weight decay (decoupled by default) and EMA momentum, b ← μ·b + (1−μ)·g,
//   u ← nesterov ? (1−μ)·g + μ·b : b,
//   O ← NS(u)·s(rows, cols)·κ, per Q/K/V component when the parameter is a fused QKV projection
//   and split_qkv is on (rows interleaved per query group; each of Q, K, V is orthogonalized as
//   one matrix over all groups and scaled with its own shape, §3.4.6).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "server/optim/newton_schulz.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"
#include "server/optim/workspace.h"

namespace optstep {

enum class ScaleMode { kSpectral, kShapeScaling, kUnitRmsNorm };

// "spectral", "shape_scaling", "unit_rms_norm"; otherwise INVALID_ARGUMENT naming `owner`.
absl::StatusOr<ScaleMode> ParseScaleMode(absl::string_view owner, absl::string_view name);

// s(rows, cols) of spec §3.4.4: √max(rows, cols), √max(1, rows/cols) or √(rows/cols).
double MuonScaleFactor(ScaleMode mode, int64_t rows, int64_t cols);

// Validated Muon settings and the scratch of one optimizer. Thread-compatible.
class MuonCore {
 public:
  // INVALID_ARGUMENT naming `owner` and the value: lr < 0, momentum ∉ [0, 1), weight_decay < 0,
  // num_ns_steps < 1, unknown coefficient_type / scale_mode / fp32_matmul_prec, custom without
  // coefficients or with a length that is not a multiple of 3, non-finite extra_scale_factor,
  // ns_eps <= 0. Logs a warning for "aol" (spec §8.2 #1: a dominant direction flips sign).
  static absl::StatusOr<std::unique_ptr<MuonCore>> Create(const std::string& owner,
                                                          const MuonConfig& config);

  const MuonConfig& config() const { return config_; }

  // INVALID_ARGUMENT naming the parameter: not 2-D, or a QKV split whose Σ rows do not divide
  // the parameter's rows. `kind` names the optimizer in the message.
  absl::Status CheckParam(absl::string_view kind, const ParamInfo& param) const;
  // "momentum_buffer" (shape of the parameter, zeros); copies the QKV split into `state`.
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const;
  // Decay + momentum + orthogonalization of one step. Returns a view of O (fp32, the
  // parameter's shape) valid until the next call.
  absl::StatusOr<Tensor> Orthogonalized(Device& device, const StepArgs& args, const Tensor& grad,
                                        Tensor& param, ParamState& state);

  // Bytes of the state InitState allocates (the momentum buffer).
  int64_t StateBytes(const ParamInfo& param) const { return param.numel() * 4; }
  // The scratch of Orthogonalized for `param` (Optimizer::PlanWorkspace): this core's workspace
  // in `plan`, Newton–Schulz's in plan.Part(0).
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const;

  // Bytes moved by the element-wise parts (decay/momentum 24, apply 12 per element) plus
  // Newton–Schulz flops / Optimizer::kFlopsPerByte (spec §6), per component when split.
  double EstimateStepCost(const ParamInfo& param) const;

 private:
  MuonCore(const MuonConfig& config, NewtonSchulzOptions ns, ScaleMode scale_mode)
      : config_(config), scale_mode_(scale_mode), ns_(std::move(ns)) {}

  // out ← NS(u)·s·κ for one matrix.
  absl::Status OrthogonalizeOne(Device& device, const Tensor& u, Tensor& out);

  const MuonConfig config_;
  const ScaleMode scale_mode_;
  NewtonSchulz ns_;
  Workspace workspace_;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_MUON_CORE_H_
