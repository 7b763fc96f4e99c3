#include "server/engine/replica_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

std::string CounterBytes(uint64_t value) {
  const int64_t v = static_cast<int64_t>(value);
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

uint64_t CounterValue(const StateTensor& t) {
  int64_t v = 0;
  std::memcpy(&v, t.bytes.data(), sizeof(v));
  return static_cast<uint64_t>(v);
}

absl::Status CheckRange(const std::string& key, uint64_t size, uint64_t offset, size_t n) {
  if (offset > size || n > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("state tensor '", key, "': bytes [", offset, ", ",
                                              offset + n, ") exceed its ", size, " bytes"));
  }
  return absl::OkStatus();
}

// A 0-d int64 counter whose value is fixed when the tensor is selected.
HeldTensor CounterTensor(std::string key, uint64_t value) {
  HeldTensor t;
  t.key = std::move(key);
  t.type = StateTensor::Type::kI64;
  t.bytes = sizeof(int64_t);
  t.read = [key = t.key, bytes = CounterBytes(value)](uint64_t offset, size_t n, void* dst) {
    OPTSTEP_RETURN_IF_ERROR(CheckRange(key, bytes.size(), offset, n));
    std::memcpy(dst, bytes.data() + offset, n);
    return absl::OkStatus();
  };
  return t;
}

// An fp32 device tensor; `owner` keeps the device and the tensor alive.
HeldTensor DeviceTensor(std::string key, std::shared_ptr<const void> owner, Device* device,
                        const Tensor* tensor) {
  HeldTensor t;
  t.key = std::move(key);
  t.shape = tensor->shape();
  t.bytes = tensor->bytes();
  t.read = [key = t.key, owner = std::move(owner), device, tensor](uint64_t offset, size_t n,
                                                                   void* dst) -> absl::Status {
    OPTSTEP_RETURN_IF_ERROR(CheckRange(key, tensor->bytes(), offset, n));
    if (offset % 4 == 0 && n % 4 == 0) {
      return device->CopyToHost(*tensor, offset / 4, n / 4, DType::kF32, dst);
    }
    // A range that splits elements: copy the whole elements around it.
    const uint64_t first = offset / 4, last = (offset + n + 3) / 4;
    std::string whole((last - first) * 4, '\0');
    OPTSTEP_RETURN_IF_ERROR(
        device->CopyToHost(*tensor, first, last - first, DType::kF32, whole.data()));
    std::memcpy(dst, whole.data() + offset % 4, n);
    return absl::OkStatus();
  };
  return t;
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

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> ReplicaState::BuildSnapshot(DType dtype,
                                                                                 uint64_t step) {
  std::shared_ptr<ParamSnapshot> snapshot = EmptySnapshot(dtype, step);
  for (int p = 0; p < num_params(); ++p) OPTSTEP_RETURN_IF_ERROR(CopyToSnapshot(p, *snapshot));
  return std::shared_ptr<const ParamSnapshot>(std::move(snapshot));
}

std::shared_ptr<ParamSnapshot> ReplicaState::EmptySnapshot(DType dtype, uint64_t step) const {
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->step = step;
  snapshot->dtype = dtype;
  snapshot->values.resize(numels_.size());
  for (int p = 0; p < num_params(); ++p) {
    snapshot->values[p].resize(numels_[p] * DTypeSize(dtype));
  }
  return snapshot;
}

absl::Status ReplicaState::CopyToSnapshot(int param, ParamSnapshot& snapshot) {
  return device_->CopyToHost(params_[param], 0, params_[param].numel(), snapshot.dtype,
                             snapshot.values[param].data());
}

std::vector<HeldTensor> ReplicaState::SelectTensors(const StateSelection& selection,
                                                    std::shared_ptr<const void> owner,
                                                    const StepCounters& counters) {
  const std::set<uint32_t> chunks(selection.model_chunks.begin(), selection.model_chunks.end());
  auto wanted = [&](int p) {
    return chunks.empty() || chunks.count(config_.params[p].model_chunk) > 0;
  };
  std::vector<HeldTensor> tensors;
  for (int p = 0; p < num_params(); ++p) {
    if (!wanted(p) || selection.params == StateSelection::Params::kNone ||
        (selection.params == StateSelection::Params::kOwned && !owns(p))) {
      continue;
    }
    tensors.push_back(DeviceTensor("param/" + names_[p], owner, device_.get(), &params_[p]));
  }
  for (const GroupRuntime& group : groups_) {
    const std::string& sub = config_.chain.sub_optimizers[group.def.sub_optimizer].name;
    for (int p : group.def.param_ids) {
      if (!selection.owned_state || !wanted(p) || !owns(p)) continue;
      for (const auto& [key, tensor] : states_[p].tensors) {
        tensors.push_back(DeviceTensor(absl::StrCat("state/", sub, "/", names_[p], "/", key), owner,
                                       device_.get(), &tensor));
      }
    }
    if (selection.counters) {
      tensors.push_back(CounterTensor(absl::StrCat("state/", sub, "/group", group.def.id, "/step"),
                                      group.applied_steps));
    }
  }
  if (selection.counters) {
    tensors.push_back(CounterTensor("meta/step", counters.step));
    tensors.push_back(CounterTensor("meta/skipped_steps", counters.skipped_steps));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const HeldTensor& a, const HeldTensor& b) { return a.key < b.key; });
  return tensors;
}

absl::StatusOr<std::shared_ptr<const StateDict>> ReplicaState::CopyToHost(
    const std::vector<HeldTensor>& tensors) {
  auto dict = std::make_shared<StateDict>();
  for (const HeldTensor& t : tensors) {
    StateTensor& out = (*dict)[t.key];
    out.type = t.type;
    out.shape = t.shape;
    out.bytes.resize(t.bytes);
    OPTSTEP_RETURN_IF_ERROR(t.read(0, t.bytes, out.bytes.data()));
  }
  return std::shared_ptr<const StateDict>(std::move(dict));
}

absl::StatusOr<std::shared_ptr<ResolvedState>> ReplicaState::Resolve(
    std::shared_ptr<const StateDict> state) {
  auto resolved = std::make_shared<ResolvedState>();
  resolved->group_steps.resize(groups_.size());
  std::map<std::string, int> param_of;
  for (int p = 0; p < num_params(); ++p) param_of[names_[p]] = p;
  auto fail = [this](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict key '", key, "' for session '", id_, "': ", why));
  };
  auto sub_of = [this](const GroupRuntime& g) -> const std::string& {
    return config_.chain.sub_optimizers[g.def.sub_optimizer].name;
  };
  for (const auto& [key, value] : *state) {
    const bool counter = value.type == StateTensor::Type::kI64;
    const size_t element = counter ? sizeof(int64_t) : sizeof(float);
    if (value.bytes.size() != static_cast<size_t>(NumElements(value.shape)) * element) {
      return fail(key, absl::StrCat(value.bytes.size(), " bytes do not hold shape ",
                                    ShapeString(value.shape)));
    }
    if (key == "meta/step" || key == "meta/skipped_steps") {
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      (key == "meta/step" ? resolved->step : resolved->skipped_steps) = CounterValue(value);
      continue;
    }
    if (absl::StartsWith(key, "param/")) {
      auto it = param_of.find(key.substr(6));
      if (it == param_of.end()) return fail(key, "no such parameter");
      Tensor& param = params_[it->second];
      if (counter || value.shape != param.shape()) {
        return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(param.shape())));
      }
      resolved->targets.emplace_back(&value, &param);
      continue;
    }
    if (!absl::StartsWith(key, "state/")) return fail(key, "not a param/, state/ or meta/ key");
    const std::string rest = key.substr(6);
    const size_t first = rest.find('/'), last = rest.rfind('/');
    if (first == std::string::npos || last == first) return fail(key, "malformed state key");
    const std::string sub = rest.substr(0, first),
                      middle = rest.substr(first + 1, last - first - 1),
                      leaf = rest.substr(last + 1);
    if (leaf == "step" && absl::StartsWith(middle, "group")) {
      int id = -1;
      if (!absl::SimpleAtoi(middle.substr(5), &id) || id < 0 ||
          id >= static_cast<int>(groups_.size()) || sub_of(groups_[id]) != sub) {
        return fail(key, "no such group of that sub-optimizer");
      }
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      resolved->group_steps[id] = CounterValue(value);
      continue;
    }
    auto it = param_of.find(middle);
    if (it == param_of.end()) return fail(key, "no such parameter");
    const int p = it->second;
    if (sub_of(groups_[group_of_[p]]) != sub) {
      return fail(key, "the parameter belongs to another sub-optimizer");
    }
    if (!owns(p)) {
      return fail(key, absl::StrCat("the parameter is owned by rank ", layout_.owner[p],
                                    ", not rank ", rank_));
    }
    Tensor* tensor = states_[p].Find(leaf);
    if (tensor == nullptr) return fail(key, "no such state tensor");
    if (counter || value.shape != tensor->shape()) {
      return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(tensor->shape())));
    }
    resolved->targets.emplace_back(&value, tensor);
  }
  resolved->state = std::move(state);
  return resolved;
}

absl::Status ReplicaState::WriteResolved(const ResolvedState& resolved) {
  for (const auto& [value, tensor] : resolved.targets) {
    OPTSTEP_RETURN_IF_ERROR(
        device_->CopyFromHost(value->bytes.data(), DType::kF32, tensor->numel(), *tensor, 0));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (resolved.group_steps[g]) groups_[g].applied_steps = *resolved.group_steps[g];
  }
  return absl::OkStatus();
}

}  // namespace optstep
