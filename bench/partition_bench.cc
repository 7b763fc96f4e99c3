// Balance of the layer-wise partition: optstep's cost-balanced LPT partitioner against
// Megatron's ping-pong baseline (spec §6), for GPT-like layouts with the Megatron `muon` preset
// (Muon for hidden matrices, AdamW for embeddings, output and 1-D parameters).
//
//   bazel run //bench:partition_bench
//
// Prints, per model and world size, max/mean estimated step cost over ranks for both, and the
// memory (optimizer-state bytes) max/mean alongside. Goal: <= 1.05 where the largest parameter
// allows it, and never worse than the baseline.

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/partition.h"
#include "server/engine/cost_model.h"
#include "server/optim/presets.h"

namespace optstep {
namespace {

struct Gpt {
  const char* name;
  int layers;
  int64_t hidden;
  int64_t ffn;
  int64_t vocab;
};

std::vector<ParamInfo> Layout(const Gpt& g) {
  std::vector<ParamInfo> params;
  auto add = [&params](std::string name, Shape shape, bool embedding = false) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.embedding_or_output = embedding;
    params.push_back(std::move(p));
  };
  add("embedding.word_embeddings.weight", {g.vocab, g.hidden}, true);
  add("embedding.position_embeddings.weight", {2048, g.hidden});
  for (int l = 0; l < g.layers; ++l) {
    const std::string prefix = absl::StrCat("layers.", l, ".");
    add(prefix + "input_layernorm.weight", {g.hidden});
    add(prefix + "input_layernorm.bias", {g.hidden});
    add(prefix + "attention.qkv.weight", {3 * g.hidden, g.hidden});
    add(prefix + "attention.qkv.bias", {3 * g.hidden});
    add(prefix + "attention.proj.weight", {g.hidden, g.hidden});
    add(prefix + "attention.proj.bias", {g.hidden});
    add(prefix + "post_attention_layernorm.weight", {g.hidden});
    add(prefix + "post_attention_layernorm.bias", {g.hidden});
    add(prefix + "mlp.fc1.weight", {g.ffn, g.hidden});
    add(prefix + "mlp.fc1.bias", {g.ffn});
    add(prefix + "mlp.fc2.weight", {g.hidden, g.ffn});
    add(prefix + "mlp.fc2.bias", {g.hidden});
  }
  add("final_layernorm.weight", {g.hidden});
  add("output_layer.weight", {g.vocab, g.hidden}, true);
  return params;
}

int Run() {
  const Gpt models[] = {{"125M", 12, 768, 3072, 50257},
                        {"1.3B", 24, 2048, 8192, 50257},
                        {"7B", 32, 4096, 11008, 32000}};
  auto chain = ExpandPreset("muon", {});
  if (!chain.ok()) {
    std::fprintf(stderr, "%s\n", chain.status().ToString().c_str());
    return 1;
  }
  std::printf("%-6s %6s %10s | %12s %12s | %12s %12s | %s\n", "model", "ranks", "params",
              "cost optstep", "cost base", "mem optstep", "mem base", "bound");
  for (const Gpt& g : models) {
    const std::vector<ParamInfo> params = Layout(g);
    auto costs = EstimateStepCosts(*chain, params);
    if (!costs.ok()) {
      std::fprintf(stderr, "%s\n", costs.status().ToString().c_str());
      return 1;
    }
    std::vector<int64_t> numels;
    std::vector<double> bytes;
    int64_t total = 0;
    for (const ParamInfo& p : params) {
      numels.push_back(p.numel());
      bytes.push_back(static_cast<double>(p.numel()));
      total += p.numel();
    }
    const double sum = std::accumulate(costs->begin(), costs->end(), 0.0);
    std::vector<double> sorted = *costs;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    for (int world : {2, 4, 8, 16, 64}) {
      const optstep::Layout lpt = PartitionByCost(*costs, world);
      const optstep::Layout base = PartitionBaseline(numels, world);
      // No partition does better than this lower bound: the largest parameter, and for every m,
      // some rank holds m + 1 of the m·world + 1 largest, so at least the m + 1 smallest of them.
      double peak = sorted[0];
      for (size_t m = 1; m * world + 1 <= sorted.size(); ++m) {
        const size_t top = m * world + 1;
        double smallest = 0.0;
        for (size_t i = top - (m + 1); i < top; ++i) smallest += sorted[i];
        peak = std::max(peak, smallest);
      }
      const double bound = std::max(1.0, peak / (sum / world));
      std::printf("%-6s %6d %9.2fB | %12.3f %12.3f | %12.3f %12.3f | %.3f\n", g.name, world,
                  total / 1e9, Imbalance(lpt, *costs), Imbalance(base, *costs),
                  Imbalance(lpt, bytes), Imbalance(base, bytes), bound);
    }
  }
  return 0;
}

}  // namespace
}  // namespace optstep

int main() { return optstep::Run(); }
