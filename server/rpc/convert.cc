#include "server/rpc/convert.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/optim/presets.h"

namespace optstep {
namespace {

template <typename T>
std::optional<double> Opt(bool has, T value) {
  return has ? std::optional<double>(static_cast<double>(value)) : std::nullopt;
}

GroupOverrides OverridesFromProto(const v1::GroupOverrides& o) {
  GroupOverrides g;
  g.lr = Opt(o.has_lr(), o.lr());
  g.weight_decay = Opt(o.has_weight_decay(), o.weight_decay());
  g.wd_mult = Opt(o.has_wd_mult(), o.wd_mult());
  g.beta1 = Opt(o.has_beta1(), o.beta1());
  g.beta2 = Opt(o.has_beta2(), o.beta2());
  g.eps = Opt(o.has_eps(), o.eps());
  g.momentum = Opt(o.has_momentum(), o.momentum());
  return g;
}

absl::StatusOr<SubOptimizerConfig> SubOptimizerFromProto(const v1::SubOptimizer& s) {
  SubOptimizerConfig sub;
  sub.name = s.name();
  sub.kind = s.kind();
  const std::string owner = absl::StrCat("sub_optimizer '", s.name(), "'");
  switch (s.options_case()) {
    case v1::SubOptimizer::kAdamw: {
      const v1::AdamWOptions& o = s.adamw();
      AdamWConfig& c = sub.adamw;
      if (o.has_lr()) c.lr = o.lr();
      if (o.has_beta1()) c.beta1 = o.beta1();
      if (o.has_beta2()) c.beta2 = o.beta2();
      if (o.has_eps()) c.eps = o.eps();
      if (o.has_weight_decay()) c.weight_decay = o.weight_decay();
      if (o.has_decoupled()) c.decoupled = o.decoupled();
      if (o.has_bias_correction()) c.bias_correction = o.bias_correction();
      break;
    }
    case v1::SubOptimizer::kSgd: {
      const v1::SgdOptions& o = s.sgd();
      SgdConfig& c = sub.sgd;
      if (o.has_lr()) c.lr = o.lr();
      if (o.has_momentum()) c.momentum = o.momentum();
      if (o.has_weight_decay()) c.weight_decay = o.weight_decay();
      if (o.has_nesterov()) c.nesterov = o.nesterov();
      break;
    }
    case v1::SubOptimizer::OPTIONS_NOT_SET:
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat(owner, ": the options given are for an optimizer this build lacks"));
  }
  // The options given must belong to the kind named.
  const bool adam_kind = s.kind() == "adamw" || s.kind() == "adam";
  if ((s.options_case() == v1::SubOptimizer::kAdamw && !adam_kind) ||
      (s.options_case() == v1::SubOptimizer::kSgd && s.kind() != "sgd")) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": options do not match kind '", s.kind(), "'"));
  }
  return sub;
}

}  // namespace

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view what) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kF32;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_FP16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": dtype ", static_cast<int>(dtype),
                                                     " is not one of fp32, bf16, fp16"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_FP32;
    case DType::kBF16:
      return v1::DTYPE_BF16;
    case DType::kF16:
      return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<ChainConfig> ChainConfigFromProto(const v1::OptimizerConfig& config) {
  ChainConfig chain;
  if (!config.preset().empty()) {
    if (config.sub_optimizers_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: preset '", config.preset(), "' and sub_optimizers are mutually exclusive"));
    }
    std::map<std::string, std::string> args(config.megatron_args().begin(),
                                            config.megatron_args().end());
    OPTSTEP_ASSIGN_OR_RETURN(chain, ExpandPreset(config.preset(), args));
  } else {
    if (config.megatron_args_size() > 0) {
      return absl::InvalidArgumentError("optimizer: megatron_args need a preset");
    }
    if (config.sub_optimizers_size() == 0) {
      return absl::InvalidArgumentError("optimizer: give a preset or at least one sub_optimizer");
    }
    for (const v1::SubOptimizer& s : config.sub_optimizers()) {
      OPTSTEP_ASSIGN_OR_RETURN(SubOptimizerConfig sub, SubOptimizerFromProto(s));
      chain.sub_optimizers.push_back(std::move(sub));
    }
  }
  for (const v1::RoutingRule& r : config.rules()) {
    RoutingRule rule;
    rule.name_glob = r.name_glob();
    if (r.has_ndim()) rule.ndim = static_cast<int>(r.ndim());
    if (r.has_embedding_or_output()) rule.embedding_or_output = r.embedding_or_output();
    rule.sub_optimizer = r.sub_optimizer();
    rule.overrides = OverridesFromProto(r.overrides());
    chain.rules.push_back(std::move(rule));
  }
  if (config.has_clip_grad()) {
    if (!std::isfinite(config.clip_grad())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: clip_grad = ", config.clip_grad(), " must be finite"));
    }
    chain.clip_grad = config.clip_grad();
  }
  if (config.has_mup_width_mult() && config.mup_width_mult() != 1.0) {
    return absl::UnimplementedError("optimizer: mup_width_mult is not available in this build");
  }
  return chain;
}

absl::StatusOr<SessionConfig> SessionConfigFromProto(const v1::SessionSpec& spec) {
  SessionConfig config;
  config.name = spec.name();
  if (spec.parameters_size() == 0) {
    return absl::InvalidArgumentError("session: declares no parameters");
  }
  std::set<std::string> names;
  for (int i = 0; i < spec.parameters_size(); ++i) {
    const v1::ParameterSpec& p = spec.parameters(i);
    if (p.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, ": name is empty"));
    }
    if (!names.insert(p.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name(), "': declared twice"));
    }
    ParamInfo info;
    info.name = p.name();
    int64_t numel = 1;
    for (uint64_t d : p.shape()) {
      if (d == 0 || d > (uint64_t{1} << 40) || numel > (int64_t{1} << 40) / static_cast<int64_t>(d)) {
        return absl::InvalidArgumentError(
            absl::StrCat("param '", p.name(), "': dimension ", d, " is not in [1, 2^40]"));
      }
      info.shape.push_back(static_cast<int64_t>(d));
      numel *= static_cast<int64_t>(d);
    }
    info.model_chunk = p.model_chunk();
    info.embedding_or_output = p.embedding_or_output();
    info.expert = p.expert();
    if (p.has_qkv()) {
      const v1::QkvSplit& q = p.qkv();
      const uint64_t rows = (uint64_t{q.q_per_group()} + 2) * q.head_dim() * q.num_query_groups();
      if (info.shape.size() != 2 || q.num_query_groups() == 0 || q.q_per_group() == 0 ||
          q.head_dim() == 0 || rows != static_cast<uint64_t>(info.shape[0])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param '", p.name(), "': qkv split (", q.num_query_groups(), " groups x (",
            q.q_per_group(), " + 2) heads x ", q.head_dim(), ") does not match shape ",
            ShapeString(info.shape)));
      }
      info.qkv = {q.num_query_groups(), q.q_per_group(), q.head_dim()};
    }
    config.params.push_back(std::move(info));
  }
  if (spec.num_trainers() < 1 || spec.num_trainers() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: num_trainers = ", spec.num_trainers(), " must be in [1, 4096]"));
  }
  config.num_trainers = static_cast<int>(spec.num_trainers());
  switch (spec.gradient_mode()) {
    case v1::GRADIENT_MODE_SHARDED:
      config.mode = GradientMode::kSharded;
      break;
    case v1::GRADIENT_MODE_REPLICATED:
      config.mode = GradientMode::kReplicated;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "session: gradient_mode ", static_cast<int>(spec.gradient_mode()),
          " must be SHARDED or REPLICATED"));
  }
  config.step_deadline = absl::Milliseconds(spec.step_deadline_ms());
  OPTSTEP_ASSIGN_OR_RETURN(config.chain, ChainConfigFromProto(spec.optimizer()));
  std::string key;
  spec.SerializeToString(&key);  // deterministic enough for identical requests
  config.definition_key = std::move(key);
  return config;
}

absl::StatusOr<StepBegin> StepBeginFromProto(const v1::StepHeader& header) {
  StepBegin begin;
  if (header.step() == 0) {
    return absl::InvalidArgumentError("step header: step must be >= 1 (the first step is 1)");
  }
  begin.step = header.step();
  begin.trainer = static_cast<int>(std::min<uint32_t>(header.trainer_id(), 1u << 30));
  for (const v1::GroupHyperparameters& g : header.groups()) {
    GroupSchedule& s = begin.schedules[static_cast<int>(std::min<uint32_t>(g.group_id(), 1u << 30))];
    if (g.has_lr()) s.lr = g.lr();
    if (g.has_weight_decay()) s.weight_decay = g.weight_decay();
  }
  if (header.return_dtype() == v1::DTYPE_UNSPECIFIED || header.return_dtype() == v1::DTYPE_FP32) {
    begin.return_dtype = DType::kF32;
  } else if (header.return_dtype() == v1::DTYPE_BF16) {
    begin.return_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("step header: return_dtype ",
                                                   static_cast<int>(header.return_dtype()),
                                                   " must be fp32 or bf16"));
  }
  begin.return_params = !header.skip_return();
  return begin;
}

absl::Status CheckParamIds(const Session& session,
                           const google::protobuf::RepeatedField<uint32_t>& ids,
                           absl::string_view what) {
  const size_t n = session.config().params.size();
  for (uint32_t id : ids) {
    if (id >= n) {
      return absl::NotFoundError(absl::StrCat(what, ": param_id ", id, " not found: session '",
                                              session.id(), "' has ", n, " parameters"));
    }
  }
  return absl::OkStatus();
}

void SessionToProto(const Session& session, v1::SessionInfo* info) {
  const SessionConfig& config = session.config();
  info->set_session_id(session.id());
  v1::SessionSpec* spec = info->mutable_spec();
  spec->ParseFromString(config.definition_key);
  v1::Layout* layout = info->mutable_layout();
  layout->set_world_size(session.layout().world_size);
  for (int owner : session.layout().owner) layout->add_owner(owner);
  for (const GroupRuntime& g : session.groups()) {
    v1::GroupInfo* group = info->add_groups();
    group->set_id(g.def.id);
    group->set_sub_optimizer(config.chain.sub_optimizers[g.def.sub_optimizer].name);
    for (int p : g.def.param_ids) group->add_param_ids(p);
    group->set_lr(g.optimizer->default_lr());
    group->set_weight_decay(g.optimizer->default_weight_decay());
    group->set_wd_mult(g.def.wd_mult);
  }
  const SessionStats stats = session.stats();
  info->set_step(stats.step);
  info->set_skipped_steps(stats.skipped_steps);
  info->set_param_bytes(stats.param_bytes);
  info->set_state_bytes(stats.state_bytes);
}

}  // namespace optstep
