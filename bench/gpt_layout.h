#ifndef OPTSTEP_BENCH_GPT_LAYOUT_H_
#define OPTSTEP_BENCH_GPT_LAYOUT_H_

// A GPT-2-small-like parameter layout (hidden 768, 12 heads, FFN 3072, vocabulary 50257,
// 1024 positions: 124.4M parameters for 12 layers) and a stepper that runs an optimizer chain
// over such parameters on one device as the engine's step does (route, group optimizers, state,
// every group steps its parameters), for the benchmarks. Not thread-safe.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "server/optim/optimizer.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"
#include "server/optim/routing.h"

namespace optstep {
namespace bench {

struct GptShape {
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t ffn = 3072;
  int64_t vocab = 50257;
  int64_t positions = 1024;
  int64_t layers = 12;
};

// Layer `index`: two layer norms, fused QKV (flagged for the split), projection, FFN, biases.
std::vector<ParamInfo> GptLayer(const GptShape& shape, int index);
// Everything outside the layers: word embedding (flagged embedding/output; tied output layer),
// learned position embedding (not flagged: a matrix optimizer takes it, spec §4), final norm.
std::vector<ParamInfo> GptRest(const GptShape& shape);
int64_t CountElements(const std::vector<ParamInfo>& params);

class ChainStepper {
 public:
  // Routes `params` through `chain` and allocates masters, gradients (random, fixed) and state
  // on `device`.
  static absl::StatusOr<std::unique_ptr<ChainStepper>> Create(Device& device,
                                                              const ChainConfig& chain,
                                                              std::vector<ParamInfo> params);

  // One step of every parameter (lr 1e-4, weight decay 0.01), then Device::Synchronize.
  absl::Status Step();

 private:
  struct Group {
    ParamGroup def;
    std::unique_ptr<Optimizer> optimizer;
    int64_t applied = 0;
  };
  ChainStepper(Device& device, std::vector<ParamInfo> params)
      : device_(device), params_(std::move(params)) {}

  Device& device_;
  std::vector<ParamInfo> params_;
  std::vector<Group> groups_;
  std::vector<Tensor> masters_;
  std::vector<Tensor> grads_;
  std::vector<ParamState> states_;
};

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_GPT_LAYOUT_H_
