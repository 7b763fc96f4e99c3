#include "server/optim/presets.h"

#include <cstdint>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

// Reads megatron_args, remembering which keys were used.
class Args {
 public:
  explicit Args(const std::map<std::string, std::string>& args) : args_(args) {}

  bool Has(const std::string& key) const { return args_.count(key) > 0; }

  absl::Status Double(const std::string& key, double* out) {
    const std::string* text = Find(key);
    if (text != nullptr && !absl::SimpleAtod(*text, out)) return Bad(key, "a number");
    return absl::OkStatus();
  }
  absl::Status Int(const std::string& key, int64_t* out) {
    const std::string* text = Find(key);
    if (text != nullptr && !absl::SimpleAtoi(*text, out)) return Bad(key, "an integer");
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& key, bool* out) {
    const std::string* text = Find(key);
    if (text != nullptr && !absl::SimpleAtob(*text, out)) return Bad(key, "true or false");
    return absl::OkStatus();
  }
  void String(const std::string& key, std::string* out) {
    const std::string* text = Find(key);
    if (text != nullptr) *out = *text;
  }

  // INVALID_ARGUMENT naming the first key no reader used.
  absl::Status CheckAllUsed(const std::string& preset) const {
    for (const auto& entry : args_) {
      if (used_.count(entry.first) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer: megatron_args key '",
                                                       entry.first, "' does not apply to preset '",
                                                       preset, "'"));
      }
    }
    return absl::OkStatus();
  }

 private:
  const std::string* Find(const std::string& key) {
    auto it = args_.find(key);
    if (it == args_.end()) return nullptr;
    used_.insert(key);
    return &it->second;
  }
  absl::Status Bad(const std::string& key, const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: megatron_args['", key, "'] = '",
                                                   args_.at(key), "' is not ", what));
  }

  const std::map<std::string, std::string>& args_;
  std::set<std::string> used_;
};

absl::StatusOr<SubOptimizerConfig> AdamPart(Args& args) {
  SubOptimizerConfig sub;
  sub.name = "adam";
  sub.kind = "adamw";
  AdamWConfig& c = sub.adamw;
  c.weight_decay = 0.01;
  OPTSTEP_RETURN_IF_ERROR(args.Double("lr", &c.lr));
  OPTSTEP_RETURN_IF_ERROR(args.Double("weight_decay", &c.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(args.Double("adam_beta1", &c.beta1));
  OPTSTEP_RETURN_IF_ERROR(args.Double("adam_beta2", &c.beta2));
  OPTSTEP_RETURN_IF_ERROR(args.Double("adam_eps", &c.eps));
  return sub;
}

absl::Status MuonPart(Args& args, MuonConfig& c) {
  c.momentum = 0.9;  // the Megatron CLI default (the library's is 0.95)
  OPTSTEP_RETURN_IF_ERROR(args.Double("lr", &c.lr));
  OPTSTEP_RETURN_IF_ERROR(args.Double("weight_decay", &c.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(args.Double("muon_momentum", &c.momentum));
  OPTSTEP_RETURN_IF_ERROR(args.Bool("muon_nesterov", &c.nesterov));
  args.String("muon_coefficient_type", &c.coefficient_type);
  OPTSTEP_RETURN_IF_ERROR(args.Int("muon_num_ns_steps", &c.num_ns_steps));
  args.String("muon_scale_mode", &c.scale_mode);
  OPTSTEP_RETURN_IF_ERROR(args.Double("muon_extra_scale_factor", &c.extra_scale_factor));
  args.String("muon_fp32_matmul_prec", &c.fp32_matmul_prec);
  OPTSTEP_RETURN_IF_ERROR(args.Bool("muon_split_qkv", &c.split_qkv));
  std::string tp_mode = "blockwise";
  args.String("muon_tp_mode", &tp_mode);
  if (tp_mode != "blockwise" && tp_mode != "duplicated" && tp_mode != "distributed") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: megatron_args['muon_tp_mode'] = '", tp_mode,
                     "' is not one of blockwise, duplicated, distributed"));
  }
  return absl::OkStatus();
}

// Betas of a sub-optimizer that Megatron feeds from adam_beta1/2 unless `prefix`_beta1/2 say.
absl::Status Betas(Args& args, const std::string& prefix, double* beta1, double* beta2) {
  *beta1 = 0.9;
  *beta2 = 0.999;
  OPTSTEP_RETURN_IF_ERROR(
      args.Double(args.Has(prefix + "_beta1") ? prefix + "_beta1" : "adam_beta1", beta1));
  return args.Double(args.Has(prefix + "_beta2") ? prefix + "_beta2" : "adam_beta2", beta2);
}

absl::Status SoapPart(Args& args, SoapConfig& c) {
  OPTSTEP_RETURN_IF_ERROR(Betas(args, "soap", &c.beta1, &c.beta2));
  c.use_kl_shampoo = true;
  OPTSTEP_RETURN_IF_ERROR(args.Double("lr", &c.lr));
  OPTSTEP_RETURN_IF_ERROR(args.Double("weight_decay", &c.weight_decay));
  OPTSTEP_RETURN_IF_ERROR(args.Double("soap_shampoo_beta", &c.shampoo_beta));
  OPTSTEP_RETURN_IF_ERROR(args.Double("soap_eps", &c.eps));
  OPTSTEP_RETURN_IF_ERROR(args.Int("soap_precondition_frequency", &c.precondition_frequency));
  OPTSTEP_RETURN_IF_ERROR(args.Int("soap_warmup_steps", &c.warmup_steps));
  OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_use_kl_shampoo", &c.use_kl_shampoo));
  OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_correct_bias", &c.correct_bias));
  if (args.Has("soap_correct_shampoo_beta_bias")) {
    bool value = true;
    OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_correct_shampoo_beta_bias", &value));
    c.correct_shampoo_beta_bias = value;
  }
  OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_nesterov", &c.nesterov));
  args.String("soap_fp32_matmul_prec", &c.fp32_matmul_prec);
  args.String("soap_qr_fp32_matmul_prec", &c.qr_fp32_matmul_prec);
  OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_use_eigh", &c.use_eigh));
  OPTSTEP_RETURN_IF_ERROR(args.Int("soap_power_iter_steps", &c.power_iter_steps));
  OPTSTEP_RETURN_IF_ERROR(args.Bool("soap_use_adaptive_criteria", &c.use_adaptive_criteria));
  OPTSTEP_RETURN_IF_ERROR(
      args.Double("soap_adaptive_update_tolerance", &c.adaptive_update_tolerance));
  return args.Double("soap_max_update_rms", &c.max_update_rms);
}

absl::Status LionPart(Args& args, LionConfig& c) {
  OPTSTEP_RETURN_IF_ERROR(Betas(args, "lion", &c.beta1, &c.beta2));
  OPTSTEP_RETURN_IF_ERROR(args.Double("lr", &c.lr));
  return args.Double("weight_decay", &c.weight_decay);
}

// The matrix sub-optimizer of an emerging preset (canonical kind).
absl::StatusOr<SubOptimizerConfig> MatrixPart(const std::string& kind, Args& args) {
  SubOptimizerConfig sub;
  sub.name = kind;
  sub.kind = kind;
  if (kind == "muon") {
    OPTSTEP_RETURN_IF_ERROR(MuonPart(args, sub.muon));
  } else if (kind == "adaptive_muon") {
    OPTSTEP_RETURN_IF_ERROR(MuonPart(args, sub.adaptive_muon.muon));
    AdaptiveMuonConfig& c = sub.adaptive_muon;
    args.String("adaptive_muon_moment2_method", &c.moment2_method);
    OPTSTEP_RETURN_IF_ERROR(args.Double("adaptive_muon_beta2", &c.beta2));
    OPTSTEP_RETURN_IF_ERROR(args.Double("adaptive_muon_eps", &c.eps));
  } else if (kind == "soap") {
    OPTSTEP_RETURN_IF_ERROR(SoapPart(args, sub.soap));
  } else {
    OPTSTEP_RETURN_IF_ERROR(LionPart(args, sub.lion));
  }
  return sub;
}

}  // namespace

absl::StatusOr<ChainConfig> ExpandPreset(const std::string& preset,
                                         const std::map<std::string, std::string>& raw) {
  Args args(raw);
  ChainConfig chain;
  chain.clip_grad = 1.0;
  OPTSTEP_RETURN_IF_ERROR(args.Double("clip_grad", &chain.clip_grad));
  const std::string kind = preset == "dist_muon" ? "muon" : preset;
  if (kind == "adam") {
    OPTSTEP_ASSIGN_OR_RETURN(SubOptimizerConfig adam, AdamPart(args));
    chain.sub_optimizers.push_back(std::move(adam));
  } else if (kind == "sgd") {
    SubOptimizerConfig sub;
    sub.name = "sgd";
    sub.kind = "sgd";
    sub.sgd.momentum = 0.9;
    sub.sgd.weight_decay = 0.01;
    OPTSTEP_RETURN_IF_ERROR(args.Double("lr", &sub.sgd.lr));
    OPTSTEP_RETURN_IF_ERROR(args.Double("weight_decay", &sub.sgd.weight_decay));
    OPTSTEP_RETURN_IF_ERROR(args.Double("sgd_momentum", &sub.sgd.momentum));
    chain.sub_optimizers.push_back(std::move(sub));
  } else if (kind == "muon" || kind == "adaptive_muon" || kind == "soap" || kind == "lion") {
    OPTSTEP_ASSIGN_OR_RETURN(SubOptimizerConfig matrix, MatrixPart(kind, args));
    std::string scalar = "adam";
    args.String("scalar_optimizer", &scalar);
    SubOptimizerConfig rest;
    if (scalar == "adam") {
      OPTSTEP_ASSIGN_OR_RETURN(rest, AdamPart(args));
    } else if (scalar == "lion" && kind != "lion") {
      rest.name = "scalar_lion";
      rest.kind = "lion";
      OPTSTEP_RETURN_IF_ERROR(LionPart(args, rest.lion));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: megatron_args['scalar_optimizer'] = '", scalar, "' is not adam",
                       kind == "lion" ? "" : " or lion"));
    }
    chain.sub_optimizers.push_back(std::move(matrix));
    chain.sub_optimizers.push_back(std::move(rest));
    // The reference table of spec §4 as rules (they also hold when the scalar part is not Adam).
    RoutingRule matrices;
    matrices.ndim = 2;
    matrices.embedding_or_output = false;
    matrices.sub_optimizer = chain.sub_optimizers[0].name;
    RoutingRule others;
    others.sub_optimizer = chain.sub_optimizers[1].name;
    chain.rules = {matrices, others};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: unknown preset '", preset,
                     "' (known: adam, sgd, muon, dist_muon, adaptive_muon, soap, lion)"));
  }
  // apply_wd_to_qk_layernorm (spec §4): q/k layer-norm weights keep wd_mult 1.
  bool qk_decay = false;
  OPTSTEP_RETURN_IF_ERROR(args.Bool("apply_wd_to_qk_layernorm", &qk_decay));
  if (qk_decay) {
    std::vector<RoutingRule> rules;
    for (const char* glob : {"*q_layernorm*", "*k_layernorm*"}) {
      RoutingRule rule;
      rule.name_glob = glob;
      rule.sub_optimizer = chain.sub_optimizers.back().name;  // the scalar (or only) part
      rule.overrides.wd_mult = 1.0;
      rules.push_back(std::move(rule));
    }
    chain.rules.insert(chain.rules.begin(), rules.begin(), rules.end());
  }
  OPTSTEP_RETURN_IF_ERROR(args.CheckAllUsed(preset));
  return chain;
}

}  // namespace optstep
