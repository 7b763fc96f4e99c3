#include "server/optim/registry.h"

#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "server/optim/adamw.h"
#include "server/optim/adaptive_muon.h"
#include "server/optim/hyperparameter_checks.h"
#include "server/optim/lion.h"
#include "server/optim/muon.h"
#include "server/optim/sgd.h"
#include "server/optim/soap.h"

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

// MuP's learning-rate multiplier (spec §4) around any optimizer: every step's lr is multiplied.
class LrScaled final : public Optimizer {
 public:
  LrScaled(std::unique_ptr<Optimizer> inner, double lr_mult)
      : inner_(std::move(inner)), lr_mult_(lr_mult) {}
  std::string kind() const override { return inner_->kind(); }
  double default_lr() const override { return inner_->default_lr(); }
  double default_weight_decay() const override { return inner_->default_weight_decay(); }
  absl::Status CheckParam(const ParamInfo& param) const override {
    return inner_->CheckParam(param);
  }
  absl::Status InitState(Device& device, const ParamInfo& param, ParamState& state) const override {
    return inner_->InitState(device, param, state);
  }
  int64_t StateBytes(const ParamInfo& param) const override { return inner_->StateBytes(param); }
  void PlanWorkspace(const ParamInfo& param, WorkspacePlan& plan) const override {
    inner_->PlanWorkspace(param, plan);
  }
  absl::Status Step(Device& device, const StepArgs& args, const Tensor& grad, Tensor& param,
                    ParamState& state) override {
    StepArgs scaled = args;
    scaled.lr = args.lr * lr_mult_;
    return inner_->Step(device, scaled, grad, param, state);
  }
  double EstimateStepCost(const ParamInfo& param) const override {
    return inner_->EstimateStepCost(param);
  }

 private:
  const std::unique_ptr<Optimizer> inner_;
  const double lr_mult_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<Optimizer>> Upcast(absl::StatusOr<std::unique_ptr<T>> made) {
  if (!made.ok()) return made.status();
  return std::unique_ptr<Optimizer>(*std::move(made));
}

// Which overrides a kind accepts.
struct Accepts {
  bool beta1 = false;
  bool beta2 = false;
  bool eps = false;
  bool momentum = false;
};

absl::Status RefuseOverrides(const std::string& owner, const GroupOverrides& o,
                             absl::string_view kind, const Accepts& accepts) {
  if (!accepts.beta1) OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.beta1, "beta1", kind));
  if (!accepts.beta2) OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.beta2, "beta2", kind));
  if (!accepts.eps) {
    OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.eps, "eps", kind));
    OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.eps_mult, "eps_mult", kind));
  }
  if (!accepts.momentum) {
    OPTSTEP_RETURN_IF_ERROR(RefuseOverride(owner, o.momentum, "momentum", kind));
  }
  return absl::OkStatus();
}

// eps, then MuP's eps multiplier.
double Eps(const GroupOverrides& o, double eps) {
  return o.eps.value_or(eps) * o.eps_mult.value_or(1.0);
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeAdamW(const std::string& owner,
                                                     const SubOptimizerConfig& sub,
                                                     const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "adamw", {true, true, true, false}));
  AdamWConfig c = sub.adamw;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.beta1 = o.beta1.value_or(c.beta1);
  c.beta2 = o.beta2.value_or(c.beta2);
  c.eps = Eps(o, c.eps);
  return Upcast(AdamW::Create(owner, c));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeSgd(const std::string& owner,
                                                   const SubOptimizerConfig& sub,
                                                   const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "sgd", {false, false, false, true}));
  SgdConfig c = sub.sgd;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.momentum = o.momentum.value_or(c.momentum);
  return Upcast(Sgd::Create(owner, c));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeLion(const std::string& owner,
                                                    const SubOptimizerConfig& sub,
                                                    const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "lion", {true, true, false, false}));
  LionConfig c = sub.lion;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.beta1 = o.beta1.value_or(c.beta1);
  c.beta2 = o.beta2.value_or(c.beta2);
  return Upcast(Lion::Create(owner, c));
}

void OverrideMuon(const GroupOverrides& o, MuonConfig& c) {
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.momentum = o.momentum.value_or(c.momentum);
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeMuon(const std::string& owner,
                                                    const SubOptimizerConfig& sub,
                                                    const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "muon", {false, false, false, true}));
  MuonConfig c = sub.muon;
  OverrideMuon(o, c);
  return Upcast(Muon::Create(owner, c));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeAdaptiveMuon(const std::string& owner,
                                                            const SubOptimizerConfig& sub,
                                                            const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "adaptive_muon", {false, true, true, true}));
  AdaptiveMuonConfig c = sub.adaptive_muon;
  OverrideMuon(o, c.muon);
  c.beta2 = o.beta2.value_or(c.beta2);
  c.eps = Eps(o, c.eps);
  return Upcast(AdaptiveMuon::Create(owner, c));
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeSoap(const std::string& owner,
                                                    const SubOptimizerConfig& sub,
                                                    const GroupOverrides& o) {
  OPTSTEP_RETURN_IF_ERROR(RefuseOverrides(owner, o, "soap", {true, true, true, false}));
  SoapConfig c = sub.soap;
  c.lr = o.lr.value_or(c.lr);
  c.weight_decay = o.weight_decay.value_or(c.weight_decay);
  c.beta1 = o.beta1.value_or(c.beta1);
  c.beta2 = o.beta2.value_or(c.beta2);
  c.eps = Eps(o, c.eps);
  return Upcast(Soap::Create(owner, c));
}

const std::map<std::string, Factory>& Factories() {
  static const auto* factories = new std::map<std::string, Factory>{
      {"adamw", MakeAdamW}, {"sgd", MakeSgd},   {"lion", MakeLion},
      {"muon", MakeMuon},   {"soap", MakeSoap}, {"adaptive_muon", MakeAdaptiveMuon},
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

}  // namespace

absl::StatusOr<std::string> CanonicalOptimizerKind(absl::string_view owner,
                                                   absl::string_view kind) {
  std::string name(kind);
  auto alias = Aliases().find(name);
  if (alias != Aliases().end()) name = alias->second;
  if (Factories().count(name) > 0) return name;
  return absl::InvalidArgumentError(absl::StrCat(
      owner, ": unknown optimizer kind '", CallerText(kind), "' (known: ",
      absl::StrJoin(ImplementedOptimizerKinds(), ", "), "; aliases: adam, dist_muon)"));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(absl::string_view owner,
                                                           const SubOptimizerConfig& config,
                                                           const GroupOverrides& overrides) {
  OPTSTEP_ASSIGN_OR_RETURN(std::string kind, CanonicalOptimizerKind(owner, config.kind));
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           Factories().at(kind)(std::string(owner), config, overrides));
  if (!overrides.lr_mult || *overrides.lr_mult == 1.0) return optimizer;
  OPTSTEP_RETURN_IF_ERROR(CheckPositive(owner, "lr_mult", *overrides.lr_mult));
  return std::unique_ptr<Optimizer>(new LrScaled(std::move(optimizer), *overrides.lr_mult));
}

std::vector<std::string> ImplementedOptimizerKinds() {
  std::vector<std::string> kinds;
  for (const auto& entry : Factories()) kinds.push_back(entry.first);
  return kinds;
}

}  // namespace optstep
