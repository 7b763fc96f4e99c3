#include "client/cli/format.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/table.h"

namespace optstep {
namespace cli {

std::string FormatHealth(bool serving) { return serving ? "SERVING" : "NOT_SERVING"; }

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1023.95 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatShape(const v1::ParameterSpec& param) {
  return absl::StrCat("[", absl::StrJoin(param.shape(), ", "), "]");
}

uint64_t NumElements(const v1::ParameterSpec& param) {
  uint64_t n = 1;
  for (uint64_t dim : param.shape()) n *= dim;
  return n;
}

std::string GradientModeName(v1::GradientMode mode) {
  switch (mode) {
    case v1::GRADIENT_MODE_SHARDED:
      return "sharded";
    case v1::GRADIENT_MODE_REPLICATED:
      return "replicated";
    default:
      return "unspecified";
  }
}

std::string FormatNumber(double value) { return absl::StrFormat("%g", value); }

std::string FormatSessionList(absl::Span<const v1::SessionSummary> sessions) {
  if (sessions.empty()) return "no sessions\n";
  TextTable table({{"ID"},
                   {"NAME"},
                   {"PARAMS", true},
                   {"TRAINERS", true},
                   {"MODE"},
                   {"STEP", true},
                   {"SKIPPED", true},
                   {"BYTES", true}});
  for (const v1::SessionSummary& s : sessions) {
    table.AddRow({s.session_id(), s.name().empty() ? "-" : s.name(),
                  absl::StrCat(s.num_parameters()), absl::StrCat(s.num_trainers()),
                  GradientModeName(s.gradient_mode()), absl::StrCat(s.step()),
                  absl::StrCat(s.skipped_steps()), FormatBytes(s.param_bytes() + s.state_bytes())});
  }
  return table.Render();
}

namespace {

std::string FormatOptimizer(const v1::OptimizerConfig& config) {
  std::string out;
  if (!config.preset().empty()) {
    out = absl::StrCat("preset ", config.preset());
    if (!config.megatron_args().empty()) {
      std::map<std::string, std::string> args(config.megatron_args().begin(),
                                              config.megatron_args().end());
      absl::StrAppend(&out, " (", absl::StrJoin(args, ", ", absl::PairFormatter("=")), ")");
    }
  } else {
    std::vector<std::string> subs;
    for (const v1::SubOptimizer& sub : config.sub_optimizers()) {
      subs.push_back(absl::StrCat(sub.name(), " (", sub.kind(), ")"));
    }
    out = absl::StrCat("chain ", subs.empty() ? "-" : absl::StrJoin(subs, ", "));
    if (config.rules_size() > 0) absl::StrAppend(&out, ", ", config.rules_size(), " rule(s)");
  }
  absl::StrAppend(&out, "; clip_grad ",
                  config.has_clip_grad() ? FormatNumber(config.clip_grad()) : "default");
  if (config.has_mup_width_mult()) {
    absl::StrAppend(&out, "; mup_width_mult ", FormatNumber(config.mup_width_mult()));
  }
  return out;
}

// "rank 0: 12 params (1.5 GiB), rank 1: ..." over the fp32 sizes of the parameters.
std::string FormatLayout(const v1::SessionInfo& s) {
  const uint32_t world = std::max<uint32_t>(1, s.layout().world_size());
  std::vector<uint64_t> count(world), bytes(world);
  for (int i = 0; i < s.spec().parameters_size(); ++i) {
    const uint32_t owner = i < s.layout().owner_size() ? s.layout().owner(i) : 0;
    if (owner >= world) continue;
    ++count[owner];
    bytes[owner] += 4 * NumElements(s.spec().parameters(i));
  }
  std::vector<std::string> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    ranks.push_back(
        absl::StrCat("rank ", r, ": ", count[r], " params (", FormatBytes(bytes[r]), ")"));
  }
  return absl::StrCat("world size ", s.layout().world_size(), "; ", absl::StrJoin(ranks, ", "));
}

std::string FormatFlags(const v1::ParameterSpec& p) {
  std::vector<std::string> flags;
  if (p.embedding_or_output()) flags.push_back("embedding/output");
  if (p.expert()) flags.push_back("expert");
  if (p.has_qkv()) {
    flags.push_back(absl::StrCat("qkv(groups=", p.qkv().num_query_groups(), ", q_per_group=",
                                 p.qkv().q_per_group(), ", head_dim=", p.qkv().head_dim(), ")"));
  }
  return flags.empty() ? "-" : absl::StrJoin(flags, ", ");
}

}  // namespace

std::string FormatSessionDetails(const v1::SessionInfo& s) {
  const v1::SessionSpec& spec = s.spec();
  TextTable summary({{"FIELD"}, {"VALUE"}});
  summary.AddRow({"session", s.session_id()});
  summary.AddRow({"name", spec.name().empty() ? "-" : spec.name()});
  summary.AddRow({"trainers", absl::StrCat(spec.num_trainers(), " (",
                                           GradientModeName(spec.gradient_mode()), " gradients)")});
  summary.AddRow({"step", absl::StrCat(s.step(), " (", s.skipped_steps(), " skipped)")});
  summary.AddRow({"step deadline", spec.step_deadline_ms() == 0
                                       ? "server default"
                                       : absl::StrCat(spec.step_deadline_ms(), " ms")});
  summary.AddRow({"memory", absl::StrCat("params ", FormatBytes(s.param_bytes()), ", state ",
                                         FormatBytes(s.state_bytes()))});
  summary.AddRow({"optimizer", FormatOptimizer(spec.optimizer())});
  summary.AddRow({"layout", FormatLayout(s)});
  std::string out = summary.Render();
  out.erase(0, out.find('\n') + 1);  // the summary needs no header line

  std::map<uint32_t, uint32_t> group_of;
  for (const v1::GroupInfo& g : s.groups()) {
    for (uint32_t id : g.param_ids()) group_of[id] = g.id();
  }
  TextTable params({{"ID", true},
                    {"NAME"},
                    {"SHAPE"},
                    {"ELEMENTS", true},
                    {"CHUNK", true},
                    {"OWNER", true},
                    {"GROUP", true},
                    {"FLAGS"}});
  for (int i = 0; i < spec.parameters_size(); ++i) {
    const v1::ParameterSpec& p = spec.parameters(i);
    auto group = group_of.find(static_cast<uint32_t>(i));
    params.AddRow({absl::StrCat(i), p.name(), FormatShape(p), absl::StrCat(NumElements(p)),
                   absl::StrCat(p.model_chunk()),
                   i < s.layout().owner_size() ? absl::StrCat(s.layout().owner(i)) : "-",
                   group == group_of.end() ? "-" : absl::StrCat(group->second), FormatFlags(p)});
  }
  absl::StrAppend(&out, "\nparameters (", spec.parameters_size(), ")\n", params.Render());

  TextTable groups({{"ID", true},
                    {"SUB-OPTIMIZER"},
                    {"LR", true},
                    {"WEIGHT_DECAY", true},
                    {"WD_MULT", true},
                    {"PARAMS", true}});
  for (const v1::GroupInfo& g : s.groups()) {
    groups.AddRow({absl::StrCat(g.id()), g.sub_optimizer(), FormatNumber(g.lr()),
                   FormatNumber(g.weight_decay()), FormatNumber(g.wd_mult()),
                   absl::StrCat(g.param_ids_size())});
  }
  absl::StrAppend(&out, "\ngroups (", s.groups_size(), ")\n", groups.Render());
  return out;
}

std::string FormatError(const std::string& command, const std::string& target,
                        const absl::Status& status) {
  return absl::StrCat("optstep ", command, ": ", target, ": ",
                      absl::StatusCodeToString(status.code()), ": ", status.message(), "\n");
}

}  // namespace cli
}  // namespace optstep
