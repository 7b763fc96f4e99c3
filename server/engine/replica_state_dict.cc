#include "server/engine/replica_state_dict.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

std::string CounterBytes(uint64_t value) {
  const int64_t v = static_cast<int64_t>(value);
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A counter's value; a negative one counts nothing (a checkpoint's reader refuses it too).
std::optional<uint64_t> CounterValue(const StateTensor& t) {
  int64_t v = 0;
  std::memcpy(&v, t.bytes.data(), sizeof(v));
  if (v < 0) return std::nullopt;
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

std::vector<HeldTensor> SelectState(ReplicaState& replica, const StateSelection& selection,
                                    std::shared_ptr<const void> owner,
                                    const StepCounters& counters) {
  const std::set<uint32_t> chunks(selection.model_chunks.begin(), selection.model_chunks.end());
  auto wanted = [&](int p) {
    return chunks.empty() || chunks.count(replica.config().params[p].model_chunk) > 0;
  };
  std::vector<HeldTensor> tensors;
  for (int p = 0; p < replica.num_params(); ++p) {
    if (!wanted(p) || !replica.holds(p) || selection.params == StateSelection::Params::kNone ||
        (selection.params == StateSelection::Params::kOwned && !replica.owns(p))) {
      continue;
    }
    tensors.push_back(
        DeviceTensor("param/" + replica.names()[p], owner, &replica.device(), &replica.param(p)));
  }
  for (const GroupRuntime& group : replica.groups()) {
    const std::string& sub = replica.config().chain.sub_optimizers[group.def.sub_optimizer].name;
    for (int p : group.def.param_ids) {
      if (!selection.owned_state || !wanted(p) || !replica.owns(p)) continue;
      for (const auto& [key, tensor] : replica.state(p).tensors) {
        tensors.push_back(
            DeviceTensor(absl::StrCat("state/", sub, "/", replica.names()[p], "/", key), owner,
                         &replica.device(), &tensor));
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
    if (counters.masters_step.has_value()) {
      tensors.push_back(CounterTensor("meta/masters_step", *counters.masters_step));
    }
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const HeldTensor& a, const HeldTensor& b) { return a.key < b.key; });
  return tensors;
}

absl::StatusOr<std::shared_ptr<const StateDict>> CopyStateToHost(
    const std::vector<HeldTensor>& tensors, const std::function<absl::Status()>& after_each) {
  auto dict = std::make_shared<StateDict>();
  for (const HeldTensor& t : tensors) {
    StateTensor& out = (*dict)[t.key];
    out.type = t.type;
    out.shape = t.shape;
    out.bytes.resize(t.bytes);
    OPTSTEP_RETURN_IF_ERROR(t.read(0, t.bytes, out.bytes.data()));
    if (after_each) OPTSTEP_RETURN_IF_ERROR(after_each());
  }
  return std::shared_ptr<const StateDict>(std::move(dict));
}

absl::StatusOr<std::shared_ptr<ResolvedState>> ResolveState(ReplicaState& replica,
                                                            std::shared_ptr<const StateDict> state,
                                                            bool from_peer) {
  auto resolved = std::make_shared<ResolvedState>();
  resolved->group_steps.resize(replica.groups().size());
  std::map<std::string, int> param_of;
  for (int p = 0; p < replica.num_params(); ++p) param_of[replica.names()[p]] = p;
  auto fail = [&replica](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict key '", key, "' for session '", replica.session_id(), "': ", why));
  };
  auto sub_of = [&replica](const GroupRuntime& g) -> const std::string& {
    return replica.config().chain.sub_optimizers[g.def.sub_optimizer].name;
  };
  int masters = 0;  // written, of those the replica holds
  for (const auto& [key, value] : *state) {
    const bool counter = value.type == StateTensor::Type::kI64;
    const size_t element = counter ? sizeof(int64_t) : sizeof(float);
    if (value.bytes.size() != static_cast<size_t>(NumElements(value.shape)) * element) {
      return fail(key, absl::StrCat(value.bytes.size(), " bytes do not hold shape ",
                                    ShapeString(value.shape)));
    }
    if (key == "meta/step" || key == "meta/skipped_steps") {
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      const std::optional<uint64_t> count = CounterValue(value);
      if (!count) return fail(key, "a counter must not be negative");
      (key == "meta/step" ? resolved->step : resolved->skipped_steps) = *count;
      continue;
    }
    if (key == "meta/masters_step") {
      if (!from_peer) return fail(key, "is sent between the ranks only");
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      const std::optional<uint64_t> count = CounterValue(value);
      if (!count) return fail(key, "a counter must not be negative");
      resolved->masters_step = *count;
      continue;
    }
    if (absl::StartsWith(key, "param/")) {
      auto it = param_of.find(key.substr(6));
      if (it == param_of.end()) return fail(key, "no such parameter");
      const int p = it->second;
      const Shape& shape = replica.config().params[p].shape;
      if (counter || value.shape != shape) {
        return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(shape)));
      }
      if (replica.holds(p)) {
        resolved->targets.emplace_back(&value, &replica.param(p));
        ++masters;
      }
      continue;
    }
    if (!absl::StartsWith(key, "state/")) return fail(key, "not a param/, state/ or meta/ key");
    const std::string rest = key.substr(6);
    const size_t first = rest.find('/'), last = rest.rfind('/');
    if (first == std::string::npos || last == first) return fail(key, "malformed state key");
    const std::string sub = rest.substr(0, first),
                      middle = rest.substr(first + 1, last - first - 1),
                      leaf = rest.substr(last + 1);
    if (IsGroupStepKey(key)) {
      int id = -1;
      if (!absl::SimpleAtoi(middle.substr(5), &id) || id < 0 ||
          id >= static_cast<int>(replica.groups().size()) || sub_of(replica.groups()[id]) != sub) {
        return fail(key, "no such group of that sub-optimizer");
      }
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      const std::optional<uint64_t> count = CounterValue(value);
      if (!count) return fail(key, "a counter must not be negative");
      resolved->group_steps[id] = *count;
      continue;
    }
    auto it = param_of.find(middle);
    if (it == param_of.end()) return fail(key, "no such parameter");
    const int p = it->second;
    if (sub_of(replica.groups()[replica.group_of(p)]) != sub) {
      return fail(key, "the parameter belongs to another sub-optimizer");
    }
    if (!replica.owns(p)) {
      return fail(key, absl::StrCat("the parameter is owned by rank ", replica.layout().owner[p],
                                    ", not rank ", replica.rank()));
    }
    Tensor* tensor = replica.state(p).Find(leaf);
    if (tensor == nullptr) return fail(key, "no such state tensor");
    if (counter || value.shape != tensor->shape()) {
      return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(tensor->shape())));
    }
    resolved->targets.emplace_back(&value, tensor);
  }
  const size_t held = replica.holds_every_master() ? static_cast<size_t>(replica.num_params())
                                                   : replica.owned().size();
  resolved->every_master = static_cast<size_t>(masters) == held;
  resolved->state = std::move(state);
  return resolved;
}

absl::Status WriteResolvedState(ReplicaState& replica, const ResolvedState& resolved) {
  for (const auto& [value, tensor] : resolved.targets) {
    OPTSTEP_RETURN_IF_ERROR(replica.device().CopyFromHost(value->bytes.data(), DType::kF32,
                                                          tensor->numel(), *tensor, 0));
  }
  for (size_t g = 0; g < replica.groups().size(); ++g) {
    if (resolved.group_steps[g]) replica.groups()[g].applied_steps = *resolved.group_steps[g];
  }
  // A written state is stepped by the next step whatever came before (no redo skips it).
  replica.set_owned_applied_step(0);
  return absl::OkStatus();
}

}  // namespace optstep
