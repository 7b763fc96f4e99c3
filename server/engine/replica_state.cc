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
  std::unique_ptr<ReplicaState> replica(new ReplicaState(
      std::move(session_id), std::move(config), std::move(layout), rank, std::move(device)));
  OPTSTEP_RETURN_IF_ERROR(replica->Allocate(max_bytes));
  return replica;
}

absl::Status ReplicaState::Allocate(int64_t max_bytes) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<ParamGroup> defs,
                           RouteParameters(config_.chain, config_.params));
  group_of_.assign(config_.params.size(), 0);
  for (ParamGroup& def : defs) {
    const SubOptimizerConfig& sub = config_.chain.sub_optimizers[def.sub_optimizer];
    GroupRuntime group;
    OPTSTEP_ASSIGN_OR_RETURN(
        group.optimizer,
        CreateOptimizer(absl::StrCat("sub_optimizer '", sub.name, "' (group ", def.id, ")"), sub,
                        def.overrides));
    for (int p : def.param_ids) {
      OPTSTEP_RETURN_IF_ERROR(group.optimizer->CheckParam(config_.params[p]));
      group_of_[p] = def.id;
    }
    group.def = std::move(def);
    groups_.push_back(std::move(group));
  }

  // Every rank holds every master (they are all-gathered); only owned parameters need state and
  // a gradient buffer (one, whatever the number of trainers).
  int64_t total = 0;
  for (int p = 0; p < num_params(); ++p) total += numels_[p] * 4 * (owns(p) ? 2 : 1);
  if (max_bytes > 0 && total > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes of parameters and gradients; the "
                                                     "limit is ",
                                                     max_bytes, " bytes per session"));
  }
  states_.resize(config_.params.size());
  OPTSTEP_RETURN_IF_ERROR(AllocateMasters());
  for (int p = 0; p < num_params(); ++p) {
    const ParamInfo& info = config_.params[p];
    Tensor grad;
    if (owns(p)) {
      owned_.push_back(p);
      OPTSTEP_ASSIGN_OR_RETURN(grad, device_->Allocate(DType::kF32, info.shape));
      OPTSTEP_RETURN_IF_ERROR(
          groups_[group_of_[p]].optimizer->InitState(*device_, info, states_[p]));
      total += states_[p].bytes();
    }
    grads_.push_back(std::move(grad));
  }
  if (max_bytes > 0 && total > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("session needs ", total,
                                                     " bytes with optimizer state; the limit is ",
                                                     max_bytes, " bytes per session"));
  }
  return absl::OkStatus();
}

absl::Status ReplicaState::AllocateMasters() {
  const int world = layout_.world_size;
  rank_counts_.assign(world, 0);
  for (int p = 0; p < num_params(); ++p) rank_counts_[layout_.owner[p]] += numels_[p];
  rank_offsets_.assign(world, 0);
  for (int r = 1; r < world; ++r) rank_offsets_[r] = rank_offsets_[r - 1] + rank_counts_[r - 1];
  const int64_t total = rank_offsets_[world - 1] + rank_counts_[world - 1];
  OPTSTEP_ASSIGN_OR_RETURN(masters_, device_->Allocate(DType::kF32, {total}));
  std::vector<int64_t> next = rank_offsets_;
  for (int p = 0; p < num_params(); ++p) {
    int64_t& offset = next[layout_.owner[p]];
    params_.emplace_back(DType::kF32, config_.params[p].shape, masters_.f32() + offset,
                         Tensor::Deleter());
    offset += numels_[p];
  }
  return absl::OkStatus();
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
  return device_->CopyFromHost(data, dtype, count, params_[param_id], offset);
}

}  // namespace optstep
