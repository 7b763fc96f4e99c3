#ifndef OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_
#define OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "server/optim/param_info.h"

namespace optstep {

// The optimizer state of one parameter: named fp32 tensors of any shape (the shape of the
// parameter for Adam's moments, other shapes for SOAP's factors), in a fixed order.
struct ParamState {
  std::vector<std::pair<std::string, Tensor>> tensors;

  Tensor* Find(const std::string& key);
  int64_t bytes() const;
};

// Schedule values of one step for one group (spec §1.3).
struct StepArgs {
  double lr = 0.0;
  double weight_decay = 0.0;  // effective λ = wd · wd_mult
  int64_t group_step = 1;     // 1-based count of applied steps of the group (Adam's t)
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
  virtual absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const = 0;
  // Applies one step to `param` in place. `grad` is already averaged and clipped (spec §5).
  virtual absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                            ParamState& state) = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_OPTIM_OPTIMIZER_H_
