#include "server/optim/registry.h"

#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "server/optim/adamw.h"
#include "server/optim/sgd.h"

namespace optstep {
namespace {

using Factory = std::function<absl::StatusOr<std::unique_ptr<Optimizer>>(
    const std::string& owner, const SubOptimizerConfig& config, const GroupOverrides& overrides)>;

absl::Status RefuseOverride(const std::string& owner, const std::optional<double>& value,
                            absl::string_view name, absl::string_view kind) {
  if (!value) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(owner, ": override ", name, " = ", *value, " does not apply to ", kind));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeAdamW(const std::string& owner,
                                                     const SubOptimizerConfig& sub,
                                                     const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.momentum, "momentum", "adamw"));
  AdamWConfig c = sub.adamw;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.beta1 = o.beta1.value_or(c.beta1);
  c.beta2 = o.beta2.value_or(c.beta2);
  c.eps = o.eps.value_or(c.eps);
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<AdamW> adamw, AdamW::Create(owner, c));
  return std::unique_ptr<Optimizer>(std::move(adamw));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeSgd(const std::string& owner,
                                                   const SubOptimizerConfig& sub,
                                                   const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.beta1, "beta1", "sgd"));
  OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.beta2, "beta2", "sgd"));
  OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.eps, "eps", "sgd"));
  SgdConfig c = sub.sgd;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.momentum = o.momentum.value_or(c.momentum);
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Sgd> sgd, Sgd::Create(owner, c));
  return std::unique_ptr<Optimizer>(std::move(sgd));
}

const std::map<std::string, Factory>& Factories() {
  static const auto* factories = new std::map<std::string, Factory>{
      {"adamw", MakeAdamW},
      {"sgd", MakeSgd},
  };
  return *factories;
}

const std::map<std::string, std::string>& Aliases() {
  static const auto* aliases = new std::map<std::string, std::string>{
      {"adam", "adamw"},
      {"dist_muon", "muon"},
  };
  return *aliases;
}

bool IsPlannedKind(absl::string_view kind) {
  return kind == "lion" || kind == "muon" || kind == "adaptive_muon" || kind == "soap";
}

}  // namespace

absl::StatusOr<std::string> CanonicalOptimizerKind(absl::string_view owner, absl::string_view kind) {
  std::string name(kind);
  auto alias = Aliases().find(name);
  if (alias != Aliases().end()) name = alias->second;
  if (Factories().count(name) > 0) return name;
  if (IsPlannedKind(name)) {
    return absl::UnimplementedError(
        absl::StrCat(owner, ": optimizer kind '", kind, "' is not available in this build"));
  }
  return absl::InvalidArgumentError(absl::StrCat(owner, ": unknown optimizer kind '", kind,
                                                 "' (known: ",
                                                 absl::StrJoin(ImplementedOptimizerKinds(), ", "),
                                                 "; aliases: adam, dist_muon)"));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(absl::string_view owner,
                                                           const SubOptimizerConfig& config,
                                                           const GroupOverrides& overrides) {
  OPTSTEP_ASSIGN_OR_RETURN(std::string kind, CanonicalOptimizerKind(owner, config.kind));
  return Factories().at(kind)(std::string(owner), config, overrides);
}

std::vector<std::string> ImplementedOptimizerKinds() {
  std::vector<std::string> kinds;
  for (const auto& entry : Factories()) kinds.push_back(entry.first);
  return kinds;
}

}  // namespace optstep
