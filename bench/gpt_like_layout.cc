#include "bench/gpt_like_layout.h"

#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(int64_t, hidden, 2048, "GPT-like layout: hidden size.");
ABSL_FLAG(int64_t, ffn, 8192, "GPT-like layout: FFN size.");
ABSL_FLAG(int64_t, vocab, 50257, "GPT-like layout: vocabulary (untied embedding and output).");
ABSL_FLAG(int64_t, kv_hidden, 0,
          "GPT-like layout: width of K and of V (grouped-query); 0: hidden.");
ABSL_FLAG(bool, gated, false, "GPT-like layout: gated FFN (fused gate and up projection).");
ABSL_FLAG(bool, bias, true, "GPT-like layout: biases, layer-norm biases, learned positions.");

namespace optstep {
namespace bench {

GptLike GptLikeFromFlags(int layers) {
  GptLike g;
  g.layers = layers;
  g.hidden = absl::GetFlag(FLAGS_hidden);
  g.ffn = absl::GetFlag(FLAGS_ffn);
  g.vocab = absl::GetFlag(FLAGS_vocab);
  g.kv_hidden = absl::GetFlag(FLAGS_kv_hidden);
  g.gated = absl::GetFlag(FLAGS_gated);
  g.bias = absl::GetFlag(FLAGS_bias);
  return g;
}

std::vector<ParamInfo> GptLikeLayout(const GptLike& g) {
  std::vector<ParamInfo> params;
  auto add = [&params](std::string name, Shape shape, bool embedding = false) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.embedding_or_output = embedding;
    params.push_back(std::move(p));
  };
  const int64_t qkv = g.hidden + 2 * (g.kv_hidden > 0 ? g.kv_hidden : g.hidden);
  const int64_t fc1 = g.gated ? 2 * g.ffn : g.ffn;
  add("embedding.word_embeddings.weight", {g.vocab, g.hidden}, true);
  if (g.bias) add("embedding.position_embeddings.weight", {2048, g.hidden});
  for (int l = 0; l < g.layers; ++l) {
    const std::string prefix = absl::StrCat("layers.", l, ".");
    add(prefix + "input_layernorm.weight", {g.hidden});
    if (g.bias) add(prefix + "input_layernorm.bias", {g.hidden});
    add(prefix + "attention.qkv.weight", {qkv, g.hidden});
    if (g.bias) add(prefix + "attention.qkv.bias", {qkv});
    add(prefix + "attention.proj.weight", {g.hidden, g.hidden});
    if (g.bias) add(prefix + "attention.proj.bias", {g.hidden});
    add(prefix + "post_attention_layernorm.weight", {g.hidden});
    if (g.bias) add(prefix + "post_attention_layernorm.bias", {g.hidden});
    add(prefix + "mlp.fc1.weight", {fc1, g.hidden});
    if (g.bias) add(prefix + "mlp.fc1.bias", {fc1});
    add(prefix + "mlp.fc2.weight", {g.hidden, g.ffn});
    if (g.bias) add(prefix + "mlp.fc2.bias", {g.hidden});
  }
  add("final_layernorm.weight", {g.hidden});
  add("output_layer.weight", {g.vocab, g.hidden}, true);
  return params;
}

}  // namespace bench
}  // namespace optstep
