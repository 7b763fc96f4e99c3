#ifndef OPTSTEP_BENCH_GPT_LIKE_LAYOUT_H_
#define OPTSTEP_BENCH_GPT_LIKE_LAYOUT_H_

// The GPT-like layouts of the scale model (bench/scale_model.py, docs/scale.md), given by flags
// shared by partition_bench and step_bench: fused QKV (K and V of --kv_hidden each; 0: hidden),
// FFN (--gated: fused gate and up projection), untied embedding and output layer, and with
// --bias the biases, layer-norm biases and 2048 learned positions. The defaults are GPT-3 XL's
// shapes (1.3B with 24 layers); Llama shapes take --kv_hidden, --gated and --nobias.

#include <cstdint>
#include <vector>

#include "server/optim/param_info.h"

namespace optstep {
namespace bench {

struct GptLike {
  int layers = 24;
  int64_t hidden = 2048;
  int64_t ffn = 8192;
  int64_t vocab = 50257;
  int64_t kv_hidden = 0;  // 0: hidden
  bool gated = false;
  bool bias = true;
};

// --hidden, --ffn, --vocab, --kv_hidden, --gated and --bias, with `layers` from the binary's own
// --layers (each binary keeps its default).
GptLike GptLikeFromFlags(int layers);

// The layout's parameters in order; the embedding and the output layer are flagged
// embedding_or_output.
std::vector<ParamInfo> GptLikeLayout(const GptLike& g);

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_GPT_LIKE_LAYOUT_H_
