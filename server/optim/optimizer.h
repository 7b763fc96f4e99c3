#ifndef OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_
#define OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "server/optim/param_info.h"
#include "server/optim/workspace.h"

namespace optstep {

// The optimizer state of one parameter: named fp32 tensors of any shape (the shape of the
// parameter for Adam's moments, other shapes for SOAP's factors L, R, Q_L, Q_R and normuon's
// (m,1)/(1,n) moment), in a fixed order. Checkpoints store every tensor with its own shape.
struct ParamState {
  std::vector<std::pair<std::string, Tensor>> tensors;
  // The parameter's Q/K/V split, copied by InitState for the optimizers that need it in Step
  // (Muon's split_qkv). Derived from the session definition, not checkpointed.
  QkvSplitInfo qkv;

  Tensor* Find(const std::string& key);
  int64_t bytes() const;
};

// Schedule values of one step for one group (spec §1.3).
struct StepArgs {
  double lr = 0.0;
  double weight_decay = 0.0;  // effective λ = wd · wd_mult
  int64_t group_step = 1;     // 1-based count of applied steps of the group (Adam's t)
  // The gradient is used as g · grad_scale (fp32), the global clip coefficient: below 1 only
  // for an optimizer that scales_gradient(); the engine scales the others' gradients first.
  float grad_scale = 1.0f;
};

// One parameter of Optimizer::StepBatch: as the arguments of Optimizer::Step.
struct StepOperands {
  const Tensor* grad = nullptr;
  Tensor* param = nullptr;
  ParamState* state = nullptr;
};

// One optimizer algorithm configured for one parameter group. Parameters are independent: Step
// reads only the given parameter's state, so the order of parameters never changes the result.
// Thread-compatible; the engine's device worker makes every call.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // The registry name, e.g. "adamw".
  virtual std::string kind() const = 0;
  // The group's default learning rate and base weight decay (used when a step gives none).
  virtual double default_lr() const = 0;
  virtual double default_weight_decay() const = 0;

  // INVALID_ARGUMENT, naming the parameter, when this optimizer cannot handle `param`
  // (e.g. a 1-D parameter for a matrix optimizer).
  virtual absl::Status CheckParam(const ParamInfo& param) const = 0;
  // Allocates the zero-initialised state of `param` on `device`.
  virtual absl::Status InitState(Device& device, const ParamInfo& param,
                                 ParamState& state) const = 0;
  // Bytes of the state InitState allocates for `param` (what ParamState::bytes() then answers).
  // REQUIRES: CheckParam(param) is OK.
  virtual int64_t StateBytes(const ParamInfo& param) const = 0;
  // Records in `plan` the scratch a step of `param` may ask of this optimizer's workspaces, over
  // every branch a step can take. Planned for every parameter of the group, plan.bytes() is the
  // most the workspaces hold (what admission control counts before anything is allocated).
  virtual void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const = 0;
  // Applies one step to `param` in place. `grad` is already averaged, and clipped unless
  // scales_gradient() (spec §5).
  virtual absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                            ParamState& state) = 0;
  // Step on every parameter of `batch` with the same `args`, with the bits of Step on each in
  // turn. An element-wise optimizer may run the batch as one device loop (AdamW:
  // UpdateKernels::AdamWBatch), which saves a parallel region per parameter on the CPU; this
  // default steps them in turn. REQUIRES: distinct parameters.
  virtual absl::Status StepBatch(Device& device, const StepArgs& args,
                                 absl::Span<const StepOperands> batch);
  // Whether StepBatch runs a batch as one device loop: the engine hands such an optimizer
  // batches of parameters (server/engine/owned_update.h), the others one parameter at a time.
  virtual bool batches() const { return false; }
  // Whether Step and StepBatch clip the gradient themselves, using g · StepArgs::grad_scale in
  // the element-wise update with the bits of scaling the gradient first (Device::Scale): the
  // engine then skips that pass over the gradient. Otherwise grad_scale must be 1.
  virtual bool scales_gradient() const { return false; }

  // Relative cost of one step of `param`, for the layer-wise partitioner (spec §6). The unit is
  // a byte of memory traffic on a CPU: an element-wise optimizer costs the bytes it moves per
  // step (AdamW 28 per element: reads g, p, m, v and writes p, m, v); matrix work adds its
  // floating-point operations divided by kFlopsPerByte (a CPU core does roughly ten flops in
  // the time it streams one byte), e.g. Muon's Newton–Schulz k·(4·r²·c + 2·r³) flops for
  // r = min(m, n), c = max(m, n), per Q/K/V component when split. Deterministic, > 0.
  // REQUIRES: CheckParam(param) is OK.
  virtual double EstimateStepCost(const ParamInfo& param) const = 0;

  // The flop-to-byte exchange rate of EstimateStepCost.
  static constexpr double kFlopsPerByte = 10.0;
};

// The engine hands a batching optimizer (Optimizer::batches) a group's parameters in runs of at
// most this many fp32 bytes together (a larger parameter alone): about a device slice of AdamW on
// a CPU and the step coordinator's streaming bucket, so that batching changes neither.
constexpr int64_t kStepBatchBytes = 16 << 20;

// Cuts items of `bytes` (in order) into runs of consecutive items of at most `batch_bytes`
// together (an item larger than that is a run of its own; 0: one item per run); answers the
// runs' lengths. The engine's rule (server/engine/owned_update.h), shared with the benchmarks
// that step as it does.
std::vector<int> BatchLengths(absl::Span<const int64_t> bytes, int64_t batch_bytes);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_
