#include "server/optim/presets.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace optstep {
namespace {

// Looks up `key`; parses it into `out` when present.
absl::Status ReadArg(const std::map<std::string, std::string>& args, const std::string& key,
                     double* out, int* used) {
  auto it = args.find(key);
  if (it == args.end()) return absl::OkStatus();
  if (!absl::SimpleAtod(it->second, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: megatron_args['", key, "'] = '", it->second, "' is not a number"));
  }
  ++*used;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChainConfig> ExpandPreset(const std::string& preset,
                                         const std::map<std::string, std::string>& args) {
  ChainConfig chain;
  chain.clip_grad = 1.0;
  int used = 0;
  OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "clip_grad", &chain.clip_grad, &used));
  SubOptimizerConfig sub;
  if (preset == "adam") {
    sub.name = "adam";
    sub.kind = "adamw";
    AdamWConfig& c = sub.adamw;
    c.weight_decay = 0.01;
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "lr", &c.lr, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "weight_decay", &c.weight_decay, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "adam_beta1", &c.beta1, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "adam_beta2", &c.beta2, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "adam_eps", &c.eps, &used));
  } else if (preset == "sgd") {
    sub.name = "sgd";
    sub.kind = "sgd";
    SgdConfig& c = sub.sgd;
    c.momentum = 0.9;
    c.weight_decay = 0.01;
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "lr", &c.lr, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "weight_decay", &c.weight_decay, &used));
    OPTSTEP_RETURN_IF_ERROR(ReadArg(args, "sgd_momentum", &c.momentum, &used));
  } else if (preset == "muon" || preset == "dist_muon" || preset == "adaptive_muon" ||
             preset == "soap" || preset == "lion") {
    return absl::UnimplementedError(
        absl::StrCat("optimizer: preset '", preset, "' is not available in this build"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: unknown preset '", preset,
        "' (known: adam, sgd, muon, dist_muon, adaptive_muon, soap, lion)"));
  }
  if (used != static_cast<int>(args.size())) {
    for (const auto& entry : args) {
      static const char* kKnown[] = {"clip_grad", "lr", "weight_decay", "adam_beta1",
                                     "adam_beta2", "adam_eps", "sgd_momentum"};
      bool known = false;
      for (const char* k : kKnown) known = known || entry.first == k;
      if (!known || (preset == "adam" && entry.first == "sgd_momentum") ||
          (preset == "sgd" && absl::StartsWith(entry.first, "adam_"))) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer: megatron_args key '", entry.first,
                                                       "' does not apply to preset '", preset, "'"));
      }
    }
  }
  chain.sub_optimizers.push_back(std::move(sub));
  return chain;
}

}  // namespace optstep
