#include "server/engine/replica_state.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/registry.h"

namespace optstep {
namespace {

std::vector<int64_t> NumelsOf(const std::vector<ParamInfo>& params) {
  std::vector<int64_t> numels;
  for (const ParamInfo& p : params) numels.push_back(p.numel());
  return numels;
}

std::vector<std::string> NamesOf(const std::vector<ParamInfo>& params) {
  std::vector<std::string> names;
  for (const ParamInfo& p : params) names.push_back(p.name);
  return names;
}

// Routes the parameters into `groups` and creates their optimizers; `group_of[p]`: p's group.
absl::Status CreateGroups(const SessionConfig& config, std::vector<GroupRuntime>* groups,
                          std::vector<int>* group_of) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> defs,
                           RouteParameters(config.chain, config.params));
  group_of->assign(config.params.size(), 0);
  for (ParamGroup& def : defs) {
    const SubOptimizerConfig& sub = config.chain.sub_optimizers[def.sub_optimizer];
    GroupRuntime group;
    OPTSTEP_ASSIGN_OR_RETURN(
        group.optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", def.id, ")"), sub,
                        def.overrides));
    for (int p : def.param_ids) {
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->CheckParam(config.params[p]));
      (*group_of)[p] = def.id;
    }
    group.def = std::move(def);
    groups->push_back(std::move(group));
  }
  return absl::OkStatus();
}

// Allocates every master of `params` (or, `only` >= 0, those rank `only` owns) in one flat
// buffer, `masters`, ordered by (owner rank, param id): `blocks` describes it by rank, and
// `views[p]` is parameter p's part of it (empty for a parameter left out).
absl::Status AllocateMasters(Device& device, const Layout& layout,
                             const std::vector<ParamInfo>& params, int only, Tensor* masters,
                             MasterBlocks* blocks, std::vector<Tensor>* views) {
  const int world = layout.world_size;
  auto kept = [&](size_t p) { return only < 0 || layout.owner[p] == only; };
  blocks->counts.assign(world, 0);
  for (size_t p = 0; p < params.size(); ++p) {
    if (kept(p)) blocks->counts[layout.owner[p]] += params[p].numel();
  }
  blocks->offsets.assign(world, 0);
  for (int r = 1; r < world; ++r) {
    blocks->offsets[r] = blocks->offsets[r - 1] + blocks->counts[r - 1];
  }
  const int64_t total = blocks->offsets[world - 1] + blocks->counts[world - 1];
  OPTSTEP_ASSIGN_OR_RETURN(*masters, device.Allocate(DType::kF32, {total}));
  blocks->data = masters->f32();
  std::vector<int64_t> next = blocks->offsets;
  for (size_t p = 0; p < params.size(); ++p) {
    if (!kept(p)) {
      views->emplace_back();
      continue;
    }
    int64_t& offset = next[layout.owner[p]];
    views->emplace_back(DType::kF32, params[p].shape, blocks->data + offset, Tensor::Deleter());
    offset += params[p].numel();
  }
  return absl::OkStatus();
}

}  // namespace

ReplicaState::ReplicaState(std::string session_id, SessionConfig config, Layout layout, int rank,
                           std::shared_ptr<Device> device)
    : id_(std::move(session_id)),
      config_(std::move(config)),
      layout_(std::move(layout)),
      rank_(rank),
      device_(std::move(device)),
      names_(NamesOf(config_.params)),
      numels_(NumelsOf(config_.params)) {}

absl::StatusOr<std::unique_ptr<ReplicaState>> ReplicaState::Create(std::string session_id,
                                                                   SessionConfig config,
                                                                   Layout layout, int rank,
                                                                   int64_t max_bytes,
                                                                   std::shared_ptr<Device> device) {
  const bool all_masters = config.storage == ParameterStorage::kReplicated;
  return Build(std::move(session_id), std::move(config), std::move(layout), rank, max_bytes,
               std::move(device), all_masters);
}

absl::StatusOr<std::unique_ptr<ReplicaState>> ReplicaState::CreateShadow(
    std::string session_id, SessionConfig config, Layout layout, int owner,
    std::shared_ptr<Device> device) {
  return Build(std::move(session_id), std::move(config), std::move(layout), owner,
               /*max_bytes=*/0, std::move(device), /*all_masters=*/false);
}

absl::StatusOr<std::unique_ptr<ReplicaState>> ReplicaState::Build(
    std::string session_id, SessionConfig config, Layout layout, int rank, int64_t max_bytes,
    std::shared_ptr<Device> device, bool all_masters) {
  std::unique_ptr<ReplicaState> replica(new ReplicaState(
      std::move(session_id), std::move(config), std::move(layout), rank, std::move(device)));
  ReplicaState& r = *replica;
  r.all_masters_ = all_masters;
  OPTSTEP_RETURN_IF_ERROR(CreateGroups(r.config_, &r.groups_, &r.group_of_));

  // REPLICATED storage: every rank holds every master (they are all-gathered); only owned
  // parameters need state and a gradient buffer (one, whatever the number of trainers).
  int64_t total = 0;
  int64_t owned_numel = 0;
  for (int p = 0; p < r.num_params(); ++p) {
    if (r.owns(p)) owned_numel += r.numels_[p];
    if (all_masters || r.owns(p)) total += r.numels_[p] * 4 * (r.owns(p) ? 2 : 1);
  }
  if (max_bytes > 0 && total > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes of parameters and gradients; the "
                                                     "limit is ",
                                                     max_bytes, " bytes per session"));
  }
  r.states_.resize(r.config_.params.size());
  OPTSTEP_RETURN_IF_ERROR(AllocateMasters(*r.device_, r.layout_, r.config_.params,
                                          all_masters ? -1 : rank, &r.masters_, &r.blocks_,
                                          &r.params_));
  if (owned_numel > 0) {
    OPTSTEP_ASSIGN_OR_RETURN(r.owned_grads_, r.device_->Allocate(DType::kF32, {owned_numel}));
  }
  int64_t grad_offset = 0;
  for (int p = 0; p < r.num_params(); ++p) {
    const ParamInfo& info = r.config_.params[p];
    Tensor grad;
    if (r.owns(p)) {
      r.owned_.push_back(p);
      grad = Tensor(DType::kF32, info.shape, r.owned_grads_.f32() + grad_offset, Tensor::Deleter());
      grad_offset += info.numel();
      OPTSTEP_RETURN_IF_ERROR(
          r.groups_[r.group_of_[p]].optimizer->InitState(*r.device_, info, r.states_[p]));
      total += r.states_[p].bytes();
    }
    r.grads_.push_back(std::move(grad));
  }
  if (max_bytes > 0 && total > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes with optimizer state; the limit is ",
                                                     max_bytes, " bytes per session"));
  }
  return replica;
}

StepSchedule ReplicaState::DefaultSchedule() const {
  StepSchedule schedule;
  for (const GroupRuntime& g : groups_) {
    schedule.push_back(
        GroupStepSchedule{g.optimizer->default_lr(), g.optimizer->default_weight_decay()});
  }
  return schedule;
}

ReplicaState::Bytes ReplicaState::bytes() const {
  Bytes bytes;
  for (const Tensor& t : params_) bytes.params += t.bytes();
  for (const ParamState& s : states_) bytes.state += s.bytes();
  for (const Tensor& t : grads_) bytes.buffers += t.bytes();
  return bytes;
}

absl::StatusOr<int64_t> ReplicaState::ElementCount(int param_id, DType dtype, size_t bytes) const {
  if (param_id < 0 || param_id >= num_params()) {
    return absl::NotFoundError(absl::StrCat("param_id ", param_id, " not found: session '", id_,
                                            "' has ", num_params(), " parameters"));
  }
  const size_t size = DTypeSize(dtype);
  if (bytes % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("param '", names_[param_id], "': ", bytes,
                                                   " bytes is not a multiple of the ",
                                                   DTypeName(dtype), " element size ", size));
  }
  return static_cast<int64_t>(bytes / size);
}

absl::StatusOr<int64_t> ReplicaState::ValueCount(int param_id, int64_t offset, DType dtype,
                                                 size_t bytes) const {
  OPTSTEP_ASSIGN_OR_RETURN(const int64_t count, ElementCount(param_id, dtype, bytes));
  if (offset < 0 || count > numels_[param_id] - offset) {
    return absl::InvalidArgumentError(absl::StrCat("param '", names_[param_id], "': values [",
                                                   offset, ", ", offset + count, ") exceed ",
                                                   numels_[param_id], " elements"));
  }
  return count;
}

absl::Status ReplicaState::WriteValues(int param_id, int64_t offset, DType dtype, const void* data,
                                       int64_t count) {
  if (!holds(param_id)) return absl::OkStatus();
  return device_->CopyFromHost(data, dtype, count, params_[param_id], offset);
}

}  // namespace optstep
