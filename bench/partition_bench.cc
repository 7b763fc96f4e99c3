// Balance of the layer-wise partition in step cost and in owned bytes, for GPT-like layouts:
// optstep's partition (PartitionByCostAndMemory), its cost-only predecessor (PartitionByCost) and
// Megatron's ping-pong baseline (spec §6), with the Megatron `muon` preset (Muon for hidden
// matrices, AdamW for embeddings, output and 1-D parameters).
//
//   bazel run //bench:partition_bench
//
// Per model and world size: cost max/mean over ranks for the three and its lower bound (over the
// mean); owned bytes (master + gradient + optimizer state) max/mean for the three and their lower
// bound (over the mean; the pigeonhole bound: the largest parameter against total / ranks) and
// the peak over that bound; then the least peak cost under memory caps of 1, 1.05, 1.1 and 1.25
// times that bound.
//
// Scale mode, for bench/scale_model.py: one JSON object per world size with the layout's counts
// and the partition's per-rank peaks, for a layout given by flags:
//
//   partition_bench --scale --layers=126 --hidden=16384 --ffn=53248 --vocab=128256
//       --kv_hidden=2048 --gated --nobias --preset=adam --worlds=8,64,1024
//   partition_bench --scale --preset=sgd --preset_args=sgd_momentum=0 --worlds=2

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/gpt_like_layout.h"
#include "checkpoint/partition.h"
#include "server/engine/cost_model.h"
#include "server/optim/presets.h"

ABSL_FLAG(bool, scale, false, "Print the scale mode's JSON lines for the layout of the flags.");
ABSL_FLAG(int, layers, 24,
          "Scale mode: transformer layers (the layout's other flags: bench/gpt_like_layout.h).");
ABSL_FLAG(std::string, preset, "adam", "Scale mode: the optimizer preset.");
ABSL_FLAG(std::string, preset_args, "",
          "Scale mode: the preset's arguments, key=value[,key=value] (e.g. sgd_momentum=0).");
ABSL_FLAG(std::string, worlds, "8,16,32,64,128,256,512,1024", "Scale mode: world sizes.");

namespace optstep {
namespace {

// A layout's per-parameter loads under a preset.
struct Loads {
  std::vector<double> costs;
  std::vector<int64_t> bytes;
  std::vector<double> weights;  // bytes as doubles
  int64_t numel = 0;
};

bool LoadsOf(const std::string& preset, const std::map<std::string, std::string>& preset_args,
             const std::vector<ParamInfo>& params, Loads& out) {
  auto chain = ExpandPreset(preset, preset_args);
  absl::StatusOr<std::vector<double>> costs =
      chain.ok() ? EstimateStepCosts(*chain, params) : chain.status();
  absl::StatusOr<std::vector<int64_t>> bytes =
      costs.ok() ? EstimateOwnedBytes(*chain, params) : costs.status();
  if (!bytes.ok()) {
    std::fprintf(stderr, "%s\n", bytes.status().ToString().c_str());
    return false;
  }
  out.costs = *std::move(costs);
  out.bytes = *std::move(bytes);
  out.weights.assign(out.bytes.begin(), out.bytes.end());
  for (const ParamInfo& p : params) out.numel += p.numel();
  return true;
}

double Mean(const std::vector<double>& w, int world) {
  return std::accumulate(w.begin(), w.end(), 0.0) / world;
}

double Peak(const optstep::Layout& layout, const std::vector<double>& weights) {
  const std::vector<double> load = RankLoads(layout, weights);
  return *std::max_element(load.begin(), load.end());
}

int Table() {
  struct Named {
    const char* name;
    bench::GptLike layout;
  };
  const Named models[] = {{"125M", {12, 768, 3072, 50257}},
                          {"1.3B", {24, 2048, 8192, 50257}},
                          {"7B", {32, 4096, 11008, 32000}}};
  std::printf(
      "cost and owned bytes, max/mean over ranks: now = cost and memory, cost = cost only, "
      "base = Megatron's ping-pong; bound = lower bound of any partition / mean; n/b = now's "
      "bytes max / their bound\n");
  std::printf("%-5s %5s %7s | %5s %5s %5s %5s | %5s %5s %5s %5s %5s | %s\n", "model", "ranks",
              "params", "now", "cost", "base", "bound", "now", "cost", "base", "bound", "n/b",
              "cost at memory cap x1, x1.05, x1.1, x1.25 of the bound");
  for (const Named& g : models) {
    const std::vector<ParamInfo> params = bench::GptLikeLayout(g.layout);
    Loads loads;
    if (!LoadsOf("muon", {}, params, loads)) return 1;
    std::vector<int64_t> numels;
    for (const ParamInfo& p : params) numels.push_back(p.numel());
    for (int world : {2, 4, 8, 16, 64}) {
      const optstep::Layout now = PartitionByCostAndMemory(loads.costs, loads.bytes, world);
      const optstep::Layout cost = PartitionByCost(loads.costs, world);
      const optstep::Layout base = PartitionBaseline(numels, world);
      const double mem_bound = PeakLowerBound(loads.weights, world);
      std::string capped;
      for (double slack : {1.0, 1.05, 1.1, 1.25}) {
        absl::StatusOr<optstep::Layout> layout = PartitionWithinMemory(
            loads.costs, loads.bytes, world, static_cast<int64_t>(mem_bound * slack));
        absl::StrAppend(&capped, " ",
                        layout.ok() ? absl::StrFormat("%5.3f", Imbalance(*layout, loads.costs))
                                    : std::string("    -"));
      }
      std::printf("%-5s %5d %6.2fB | %5.3f %5.3f %5.3f %5.3f | %5.3f %5.3f %5.3f %5.3f %5.3f |%s\n",
                  g.name, world, loads.numel / 1e9, Imbalance(now, loads.costs),
                  Imbalance(cost, loads.costs), Imbalance(base, loads.costs),
                  PeakLowerBound(loads.costs, world) / Mean(loads.costs, world),
                  Imbalance(now, loads.weights), Imbalance(cost, loads.weights),
                  Imbalance(base, loads.weights), mem_bound / Mean(loads.weights, world),
                  Peak(now, loads.weights) / mem_bound, capped.c_str());
    }
  }
  return 0;
}

int Scale() {
  const std::vector<ParamInfo> params =
      bench::GptLikeLayout(bench::GptLikeFromFlags(absl::GetFlag(FLAGS_layers)));
  std::map<std::string, std::string> preset_args;
  for (absl::string_view arg :
       absl::StrSplit(absl::GetFlag(FLAGS_preset_args), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    preset_args.insert(std::move(kv));
  }
  Loads loads;
  if (!LoadsOf(absl::GetFlag(FLAGS_preset), preset_args, params, loads)) return 1;
  int64_t largest = 0;
  for (const ParamInfo& p : params) largest = std::max(largest, p.numel());
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_worlds), ',')) {
    int world = 0;
    if (!absl::SimpleAtoi(text, &world) || world < 1) {
      std::fprintf(stderr, "--worlds: '%s' is not a world size\n", std::string(text).c_str());
      return 1;
    }
    const absl::Time start = absl::Now();
    const optstep::Layout layout = PartitionByCostAndMemory(loads.costs, loads.bytes, world);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const std::vector<double> bytes = RankLoads(layout, loads.weights);
    const int peak_rank =
        static_cast<int>(std::max_element(bytes.begin(), bytes.end()) - bytes.begin());
    double with_shadow = bytes[peak_rank];  // state redundancy: the predecessor's part too
    if (world > 1) {
      for (int r = 0; r < world; ++r) {
        with_shadow = std::max(with_shadow, bytes[r] + bytes[(r + world - 1) % world]);
      }
    }
    int64_t peak_numel = 0;
    for (size_t p = 0; p < params.size(); ++p) {
      if (layout.owner[p] == peak_rank) peak_numel += params[p].numel();
    }
    std::printf(
        "{\"world\": %d, \"params\": %zu, \"numel\": %lld, \"largest_numel\": %lld, "
        "\"owned_bytes_total\": %.0f, \"owned_bytes_max\": %.0f, \"owned_bytes_bound\": %.0f, "
        "\"owned_with_shadow_max\": %.0f, \"peak_rank_numel\": %lld, "
        "\"cost_max_over_mean\": %.6f, \"partition_s\": %.3f}\n",
        world, params.size(), static_cast<long long>(loads.numel), static_cast<long long>(largest),
        Mean(loads.weights, 1), bytes[peak_rank], PeakLowerBound(loads.weights, world), with_shadow,
        static_cast<long long>(peak_numel), Imbalance(layout, loads.costs), seconds);
  }
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return absl::GetFlag(FLAGS_scale) ? optstep::Scale() : optstep::Table();
}
