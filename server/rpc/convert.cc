#include "server/rpc/convert.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/status_macros.h"
#include "kernels/tensor.h"
#include "server/optim/presets.h"

namespace optstep {
namespace {

// Bounds on the names a spec may give (besides: no control characters): a session or
// sub-optimizer name, and a parameter's (a module path such as "model.layers.31.mlp.up.weight").
constexpr size_t kMaxNameBytes = 255;
constexpr size_t kMaxParameterNameBytes = 1024;
// A step's streams and what they staged wait at most this long for the step's other trainers.
constexpr uint64_t kMaxStepDeadlineMs = 3600 * 1000;
// Routing tries every rule on every parameter, on rank 0 before any size is checked and while no
// other session is created (RankGroup's create lock), and a glob's match may take as many steps
// as the glob's bytes times the name's: a new session has at most this many rules, a rule's glob
// is no longer than a parameter's name, and the request's glob bytes times the parameters' name
// bytes (each rule against each name, at worst) stay within kMaxRoutingWork (about a second).
constexpr int kMaxRoutingRules = 256;
// The most sub-optimizers a new session's chain declares: a state dict exported by sub-optimizer
// lists each one's tensors, and a chain of thousands (unused ones are accepted) would grow that
// list, and the checks of each, past any bound of the session's size.
constexpr int kMaxSubOptimizers = 64;
constexpr int64_t kMaxRoutingWork = int64_t{1} << 30;

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

absl::StatusOr<WeightDecayMode> ModeFromProto(const std::string& owner, v1::WeightDecayMode mode,
                                              WeightDecayMode unspecified) {
  switch (mode) {
    case v1::WEIGHT_DECAY_MODE_UNSPECIFIED:
      return unspecified;
    case v1::WEIGHT_DECAY_MODE_DECOUPLED:
      return WeightDecayMode::kDecoupled;
    case v1::WEIGHT_DECAY_MODE_INDEPENDENT:
      return WeightDecayMode::kIndependent;
    case v1::WEIGHT_DECAY_MODE_L2:
      return WeightDecayMode::kL2;
    case v1::WEIGHT_DECAY_MODE_PALM:
      return WeightDecayMode::kPalm;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(owner, ": weight_decay_mode ", static_cast<int>(mode), " is unknown"));
  }
}

absl::Status MuonFromProto(const std::string& owner, const v1::MuonOptions& o, MuonConfig& c) {
  if (o.has_lr()) c.lr = o.lr();
  if (o.has_momentum()) c.momentum = o.momentum();
  if (o.has_nesterov()) c.nesterov = o.nesterov();
  if (o.has_weight_decay()) c.weight_decay = o.weight_decay();
  OPTSTEP_ASSIGN_OR_RETURN(c.weight_decay_mode,
                           ModeFromProto(owner, o.weight_decay_mode(), c.weight_decay_mode));
  if (!o.coefficient_type().empty()) c.coefficient_type = o.coefficient_type();
  c.custom_coefficients.assign(o.custom_coefficients().begin(), o.custom_coefficients().end());
  if (o.has_num_ns_steps()) c.num_ns_steps = o.num_ns_steps();
  if (!o.scale_mode().empty()) c.scale_mode = o.scale_mode();
  if (o.has_extra_scale_factor()) c.extra_scale_factor = o.extra_scale_factor();
  if (!o.fp32_matmul_prec().empty()) c.fp32_matmul_prec = o.fp32_matmul_prec();
  if (o.has_split_qkv()) c.split_qkv = o.split_qkv();
  if (o.has_ns_eps()) c.ns_eps = o.ns_eps();
  return absl::OkStatus();
}

absl::Status SoapFromProto(const std::string& owner, const v1::SoapOptions& o, SoapConfig& c) {
  if (o.has_lr()) c.lr = o.lr();
  if (o.has_beta1()) c.beta1 = o.beta1();
  if (o.has_beta2()) c.beta2 = o.beta2();
  if (o.has_shampoo_beta()) c.shampoo_beta = o.shampoo_beta();
  if (o.has_eps()) c.eps = o.eps();
  if (o.has_weight_decay()) c.weight_decay = o.weight_decay();
  OPTSTEP_ASSIGN_OR_RETURN(c.weight_decay_mode,
                           ModeFromProto(owner, o.weight_decay_mode(), c.weight_decay_mode));
  if (o.has_precondition_frequency()) c.precondition_frequency = o.precondition_frequency();
  if (o.has_precondition_warmup_steps()) c.warmup_steps = o.precondition_warmup_steps();
  if (o.has_use_kl_shampoo()) c.use_kl_shampoo = o.use_kl_shampoo();
  if (o.has_bias_correction()) c.correct_bias = o.bias_correction();
  if (o.has_correct_shampoo_beta_bias()) {
    c.correct_shampoo_beta_bias = o.correct_shampoo_beta_bias();
  }
  if (o.has_use_eigh_after_first()) c.use_eigh = o.use_eigh_after_first();
  if (o.has_max_update_rms()) c.max_update_rms = o.max_update_rms();
  if (!o.fp32_matmul_prec().empty()) c.fp32_matmul_prec = o.fp32_matmul_prec();
  if (!o.qr_fp32_matmul_prec().empty()) c.qr_fp32_matmul_prec = o.qr_fp32_matmul_prec();
  if (o.has_nesterov()) c.nesterov = o.nesterov();
  if (o.has_power_iter_steps()) c.power_iter_steps = o.power_iter_steps();
  if (o.has_use_adaptive_criteria()) c.use_adaptive_criteria = o.use_adaptive_criteria();
  if (o.has_adaptive_update_tolerance()) {
    c.adaptive_update_tolerance = o.adaptive_update_tolerance();
  }
  return absl::OkStatus();
}

// The kinds (and aliases) each options case belongs to.
bool OptionsMatchKind(v1::SubOptimizer::OptionsCase options, const std::string& kind) {
  switch (options) {
    case v1::SubOptimizer::kAdamw:
      return kind == "adamw" || kind == "adam";
    case v1::SubOptimizer::kSgd:
      return kind == "sgd";
    case v1::SubOptimizer::kLion:
      return kind == "lion";
    case v1::SubOptimizer::kMuon:
      return kind == "muon" || kind == "dist_muon";
    case v1::SubOptimizer::kAdaptiveMuon:
      return kind == "adaptive_muon";
    case v1::SubOptimizer::kSoap:
      return kind == "soap";
    case v1::SubOptimizer::OPTIONS_NOT_SET:
      return true;
  }
  return false;
}

absl::StatusOr<SubOptimizerConfig> SubOptimizerFromProto(const v1::SubOptimizer& s) {
  SubOptimizerConfig sub;
  OPTSTEP_RETURN_IF_ERROR(CheckCallerName("sub_optimizer name", s.name(), kMaxNameBytes));
  sub.name = s.name();
  sub.kind = s.kind();
  const std::string owner = absl::StrCat("sub_optimizer '", s.name(), "'");
  // The options given must belong to the kind named.
  if (!OptionsMatchKind(s.options_case(), s.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, ": options do not match kind '", CallerText(s.kind()), "'"));
  }
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
    case v1::SubOptimizer::kLion: {
      const v1::LionOptions& o = s.lion();
      LionConfig& c = sub.lion;
      if (o.has_lr()) c.lr = o.lr();
      if (o.has_beta1()) c.beta1 = o.beta1();
      if (o.has_beta2()) c.beta2 = o.beta2();
      if (o.has_weight_decay()) c.weight_decay = o.weight_decay();
      OPTSTEP_ASSIGN_OR_RETURN(c.weight_decay_mode,
                               ModeFromProto(owner, o.weight_decay_mode(), c.weight_decay_mode));
      break;
    }
    case v1::SubOptimizer::kMuon:
      OPTSTEP_RETURN_IF_ERROR(MuonFromProto(owner, s.muon(), sub.muon));
      break;
    case v1::SubOptimizer::kAdaptiveMuon: {
      const v1::AdaptiveMuonOptions& o = s.adaptive_muon();
      AdaptiveMuonConfig& c = sub.adaptive_muon;
      OPTSTEP_RETURN_IF_ERROR(MuonFromProto(owner, o.muon(), c.muon));
      if (!o.moment2_method().empty()) c.moment2_method = o.moment2_method();
      if (o.has_beta2()) c.beta2 = o.beta2();
      if (o.has_eps()) c.eps = o.eps();
      break;
    }
    case v1::SubOptimizer::kSoap:
      OPTSTEP_RETURN_IF_ERROR(SoapFromProto(owner, s.soap(), sub.soap));
      break;
    case v1::SubOptimizer::OPTIONS_NOT_SET:
      break;
  }
  return sub;
}

}  // namespace

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
  // The request's rules come first: a preset's own rules (its default routing) catch the rest.
  std::vector<RoutingRule> rules;
  for (const v1::RoutingRule& r : config.rules()) {
    RoutingRule rule;
    rule.name_glob = r.name_glob();
    if (r.has_ndim()) rule.ndim = static_cast<int>(r.ndim());
    if (r.has_embedding_or_output()) rule.embedding_or_output = r.embedding_or_output();
    rule.sub_optimizer = r.sub_optimizer();
    rule.overrides = OverridesFromProto(r.overrides());
    rules.push_back(std::move(rule));
  }
  chain.rules.insert(chain.rules.begin(), rules.begin(), rules.end());
  if (config.has_clip_grad()) {
    if (!std::isfinite(config.clip_grad())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: clip_grad = ", config.clip_grad(), " must be finite"));
    }
    chain.clip_grad = config.clip_grad();
  }
  if (config.has_mup_width_mult()) {
    if (!std::isfinite(config.mup_width_mult()) || config.mup_width_mult() <= 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: mup_width_mult = ", config.mup_width_mult(), " must be finite and > 0"));
    }
    chain.mup_width_mult = config.mup_width_mult();
  }
  return chain;
}

absl::StatusOr<SessionConfig> SessionConfigFromProto(const v1::SessionSpec& spec,
                                                     const std::string& owner,
                                                     const std::string& request_id) {
  OPTSTEP_RETURN_IF_ERROR(CheckCallerName("request_id", request_id, kMaxRequestIdBytes));
  OPTSTEP_ASSIGN_OR_RETURN(SessionConfig config, SessionConfigFromProto(spec));
  config.owner = owner;
  config.request_id = request_id;
  return config;
}

absl::Status CheckNewSessionSpec(const v1::SessionSpec& spec) {
  // Each expired step is a resolution on every rank (an abort vote, its relay and its log lines):
  // a deadline of a few milliseconds would have every rank abort the session's steps as fast as
  // its trainers send them.
  constexpr uint64_t kMinStepDeadlineMs = 100;
  if (spec.step_deadline_ms() != 0 && spec.step_deadline_ms() < kMinStepDeadlineMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: step_deadline_ms = ", spec.step_deadline_ms(),
                     " must be 0 (the server's ", "default) or at least ", kMinStepDeadlineMs));
  }
  if (spec.step_deadline_ms() > kMaxStepDeadlineMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("session: step_deadline_ms = ", spec.step_deadline_ms(), " must be at most ",
                     kMaxStepDeadlineMs, " (an hour)"));
  }
  // A shape is copied into every tensor made of it, none of which any budget counts.
  for (const v1::ParameterSpec& p : spec.parameters()) {
    if (p.shape_size() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("param '", CallerText(p.name(), 64),
                                                     "': ", p.shape_size(), " dimensions (at most ",
                                                     kMaxDims, ")"));
    }
  }
  if (spec.optimizer().sub_optimizers_size() > kMaxSubOptimizers) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", spec.optimizer().sub_optimizers_size(),
                     " sub-optimizers (at most ", kMaxSubOptimizers, ")"));
  }
  const auto& rules = spec.optimizer().rules();
  if (rules.size() > kMaxRoutingRules) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: ", rules.size(), " routing rules (at most ", kMaxRoutingRules, ")"));
  }
  int64_t glob_bytes = 0;
  for (int i = 0; i < rules.size(); ++i) {
    OPTSTEP_RETURN_IF_ERROR(CheckCallerName(absl::StrCat("optimizer: rule ", i, ": name_glob"),
                                            rules[i].name_glob(), kMaxParameterNameBytes));
    glob_bytes += static_cast<int64_t>(rules[i].name_glob().size());
  }
  int64_t name_bytes = 0;
  for (const v1::ParameterSpec& p : spec.parameters()) {
    name_bytes += static_cast<int64_t>(p.name().size());
  }
  // At most 256 x 1024 glob bytes and a message's worth of names: no overflow.
  if (glob_bytes * name_bytes > kMaxRoutingWork) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: the routing rules' globs (", glob_bytes, " bytes) against the parameters' ",
        "names (", name_bytes, " bytes) could take ", glob_bytes * name_bytes,
        " matching steps, over the bound of ", kMaxRoutingWork, ": use fewer or shorter globs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionConfig> SessionConfigFromProto(const v1::SessionSpec& spec) {
  SessionConfig config;
  OPTSTEP_RETURN_IF_ERROR(CheckCallerName("session name", spec.name(), kMaxNameBytes));
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
    OPTSTEP_RETURN_IF_ERROR(
        CheckCallerName(absl::StrCat("parameter ", i, ": name"), p.name(), kMaxParameterNameBytes));
    if (!names.insert(p.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name(), "': declared twice"));
    }
    ParamInfo info;
    info.name = p.name();
    int64_t numel = 1;
    for (uint64_t d : p.shape()) {
      if (d == 0 || d > (uint64_t{1} << 40) ||
          numel > (int64_t{1} << 40) / static_cast<int64_t>(d)) {
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
        return absl::InvalidArgumentError(
            absl::StrCat("param '", p.name(), "': qkv split (", q.num_query_groups(), " groups x (",
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
      return absl::InvalidArgumentError(absl::StrCat("session: gradient_mode ",
                                                     static_cast<int>(spec.gradient_mode()),
                                                     " must be SHARDED or REPLICATED"));
  }
  switch (spec.parameter_storage()) {
    case v1::PARAMETER_STORAGE_UNSPECIFIED:
    case v1::PARAMETER_STORAGE_REPLICATED:
      config.storage = ParameterStorage::kReplicated;
      break;
    case v1::PARAMETER_STORAGE_OWNERS:
      config.storage = ParameterStorage::kOwners;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("session: parameter_storage ",
                                                     static_cast<int>(spec.parameter_storage()),
                                                     " must be REPLICATED or OWNERS"));
  }
  // A session saved before the bound (CheckNewSessionSpec) is restored with it.
  config.step_deadline = absl::Milliseconds(std::min(spec.step_deadline_ms(), kMaxStepDeadlineMs));
  OPTSTEP_ASSIGN_OR_RETURN(config.chain, ChainConfigFromProto(spec.optimizer()));
  std::string key;
  if (spec.parameter_storage() == v1::PARAMETER_STORAGE_REPLICATED) {
    // The default spelled out is the same definition: a trainer attaches by name either way, and
    // a checkpoint saved without the field (or with it) loads either way.
    v1::SessionSpec unspecified = spec;
    unspecified.clear_parameter_storage();
    unspecified.SerializeToString(&key);
  } else {
    spec.SerializeToString(&key);  // deterministic enough for identical requests
  }
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
    GroupStepValues& s =
        begin.schedules[static_cast<int>(std::min<uint32_t>(g.group_id(), 1u << 30))];
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
  begin.return_owned = header.return_owned();
  return begin;
}

absl::Status CheckParamIds(const Session& session,
                           const google::protobuf::RepeatedField<uint32_t>& ids,
                           absl::string_view what) {
  const size_t n = session.config().params.size();
  // Each id once: the ids are kept for the stream's life, and a message of the same id repeated
  // millions of times held tens of MB per stream that no budget counts.
  std::vector<bool> listed(n);
  for (uint32_t id : ids) {
    if (id >= n) {
      return absl::NotFoundError(absl::StrCat(what, ": param_id ", id, " not found: session '",
                                              session.id(), "' has ", n, " parameters"));
    }
    if (listed[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": param_id ", id, " ('", session.config().params[id].name, "') is listed twice"));
    }
    listed[id] = true;
  }
  return absl::OkStatus();
}

std::optional<std::vector<uint32_t>> ServedParamIds(
    const Session& session, const google::protobuf::RepeatedField<uint32_t>& requested,
    bool owned_only) {
  std::vector<uint32_t> ids(requested.begin(), requested.end());
  if (session.config().storage == ParameterStorage::kReplicated && !owned_only) return ids;
  const Layout& layout = session.layout();
  if (ids.empty()) {
    for (size_t p = 0; p < layout.owner.size(); ++p) ids.push_back(static_cast<uint32_t>(p));
  }
  std::vector<uint32_t> owned;
  for (uint32_t id : ids) {
    if (layout.owner[id] == session.rank()) owned.push_back(id);
  }
  if (owned.empty()) return std::nullopt;
  return owned;
}

absl::StatusOr<std::string> DefinitionJson(const Session& session) {
  v1::SessionSpec spec;
  if (!spec.ParseFromString(session.config().definition_key)) {
    return absl::InternalError(absl::StrCat("session '", session.id(), "': bad definition"));
  }
  spec.clear_name();
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto status = google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("session '", session.id(), "': definition to JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace optstep
