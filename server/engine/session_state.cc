// Session: export and import of the state dict (masters, optimizer state, counters).

#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "server/engine/session.h"

namespace optstep {
namespace {

StateTensor Counter(uint64_t value) {
  StateTensor t;
  t.type = StateTensor::Type::kI64;
  const int64_t v = static_cast<int64_t>(value);
  t.bytes.assign(reinterpret_cast<const char*>(&v), sizeof(v));
  return t;
}

uint64_t CounterValue(const StateTensor& t) {
  int64_t v = 0;
  std::memcpy(&v, t.bytes.data(), sizeof(v));
  return static_cast<uint64_t>(v);
}

// The fp32 contents of a device tensor on the host.
absl::StatusOr<StateTensor> HostCopy(Device& device, const Tensor& tensor) {
  StateTensor t;
  t.shape = tensor.shape();
  t.bytes.resize(tensor.numel() * sizeof(float));
  OPTSTEP_RETURN_IF_ERROR(device.CopyToHost(tensor, 0, tensor.numel(), DType::kF32, t.bytes.data()));
  return t;
}

}  // namespace

void Session::ExportState(
    std::vector<uint32_t> model_chunks,
    std::function<void(absl::StatusOr<std::shared_ptr<const StateDict>>)> done) {
  if (layout_.world_size > 1) {
    return done(absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "' spans ", layout_.world_size,
        " ranks; state dict export across ranks is not available yet")));
  }
  coordinator_->Post([self = shared_from_this(), chunks = std::move(model_chunks),
                      done = std::move(done)] {
    absl::StatusOr<std::shared_ptr<const StateDict>> dict;
    absl::Status status = self->OnDevice([&] {
      dict = self->BuildStateDict(chunks);
      return dict.status();
    });
    done(status.ok() ? std::move(dict) : status);
  });
}

absl::StatusOr<std::shared_ptr<const StateDict>> Session::BuildStateDict(
    const std::vector<uint32_t>& model_chunks) {
  const std::set<uint32_t> chunks(model_chunks.begin(), model_chunks.end());
  auto wanted = [&](int p) {
    return chunks.empty() || chunks.count(config_.params[p].model_chunk) > 0;
  };
  auto dict = std::make_shared<StateDict>();
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!wanted(p)) continue;
    OPTSTEP_ASSIGN_OR_RETURN((*dict)["param/" + names_[p]], HostCopy(*device_, params_[p]));
  }
  for (const GroupRuntime& group : groups_) {
    const std::string& sub = config_.chain.sub_optimizers[group.def.sub_optimizer].name;
    for (int p : group.def.param_ids) {
      if (!wanted(p) || layout_.owner[p] != rank_) continue;
      for (const auto& [key, tensor] : states_[p].tensors) {
        OPTSTEP_ASSIGN_OR_RETURN((*dict)[absl::StrCat("state/", sub, "/", names_[p], "/", key)],
                                 HostCopy(*device_, tensor));
      }
    }
    (*dict)[absl::StrCat("state/", sub, "/group", group.def.id, "/step")] =
        Counter(group.applied_steps);
  }
  absl::MutexLock lock(&mu_);
  (*dict)["meta/step"] = Counter(step_);
  (*dict)["meta/skipped_steps"] = Counter(skipped_steps_);
  return std::shared_ptr<const StateDict>(std::move(dict));
}

void Session::ImportState(std::shared_ptr<const StateDict> state,
                          std::function<void(absl::Status)> done) {
  if (layout_.world_size > 1) {
    return done(absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "' spans ", layout_.world_size,
        " ranks; state dict import across ranks is not available yet")));
  }
  coordinator_->Post([self = shared_from_this(), state = std::move(state), done = std::move(done)] {
    {
      absl::MutexLock lock(&self->mu_);
      if (self->running_ || self->contributions_.started()) {
        return done(absl::FailedPreconditionError(absl::StrCat(
            "session '", self->id_, "': step ", self->step_ + 1,
            " is pending; import a state dict between steps")));
      }
      self->running_ = true;  // no step starts while the state is replaced
    }
    absl::Status status = self->OnDevice([&] { return self->ApplyStateDict(*state); });
    {
      absl::MutexLock lock(&self->mu_);
      self->running_ = false;
    }
    done(status);
  });
}

absl::Status Session::ApplyStateDict(const StateDict& state) {
  // Resolve and check every key before anything changes.
  struct Target {
    const StateTensor* value;
    Tensor* tensor = nullptr;  // fp32 destination
  };
  std::map<std::string, int> param_of;
  for (size_t p = 0; p < names_.size(); ++p) param_of[names_[p]] = static_cast<int>(p);
  std::vector<Target> targets;
  uint64_t step = 0, skipped = 0;
  bool has_step = false, has_skipped = false;
  std::vector<uint64_t> group_steps(groups_.size());
  std::vector<bool> has_group_step(groups_.size(), false);
  auto fail = [this](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict key '", key, "' for session '", id_, "': ", why));
  };
  for (const auto& [key, value] : state) {
    const bool counter = value.type == StateTensor::Type::kI64;
    const size_t element = counter ? sizeof(int64_t) : sizeof(float);
    if (value.bytes.size() != static_cast<size_t>(NumElements(value.shape)) * element) {
      return fail(key, absl::StrCat(value.bytes.size(), " bytes do not hold shape ",
                                    ShapeString(value.shape)));
    }
    if (key == "meta/step" || key == "meta/skipped_steps") {
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      (key == "meta/step" ? step : skipped) = CounterValue(value);
      (key == "meta/step" ? has_step : has_skipped) = true;
      continue;
    }
    if (absl::StartsWith(key, "param/")) {
      auto it = param_of.find(key.substr(6));
      if (it == param_of.end()) return fail(key, "no such parameter");
      Tensor& param = params_[it->second];
      if (counter || value.shape != param.shape()) {
        return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(param.shape())));
      }
      targets.push_back({&value, &param});
      continue;
    }
    if (!absl::StartsWith(key, "state/")) return fail(key, "not a param/, state/ or meta/ key");
    const std::string rest = key.substr(6);
    const size_t first = rest.find('/'), last = rest.rfind('/');
    if (first == std::string::npos || last == first) return fail(key, "malformed state key");
    const std::string sub = rest.substr(0, first), middle = rest.substr(first + 1, last - first - 1),
                      leaf = rest.substr(last + 1);
    if (leaf == "step" && absl::StartsWith(middle, "group")) {
      int id = -1;
      if (!absl::SimpleAtoi(middle.substr(5), &id) || id < 0 ||
          id >= static_cast<int>(groups_.size()) ||
          config_.chain.sub_optimizers[groups_[id].def.sub_optimizer].name != sub) {
        return fail(key, "no such group of that sub-optimizer");
      }
      if (!counter || !value.shape.empty()) return fail(key, "must be a 0-d int64 counter");
      group_steps[id] = CounterValue(value);
      has_group_step[id] = true;
      continue;
    }
    auto it = param_of.find(middle);
    if (it == param_of.end()) return fail(key, "no such parameter");
    const int p = it->second;
    const GroupRuntime& group = groups_[group_of_[p]];
    if (config_.chain.sub_optimizers[group.def.sub_optimizer].name != sub) {
      return fail(key, "the parameter belongs to another sub-optimizer");
    }
    Tensor* tensor = states_[p].Find(leaf);
    if (tensor == nullptr) return fail(key, "no such state tensor");
    if (counter || value.shape != tensor->shape()) {
      return fail(key, absl::StrCat("expected fp32 of shape ", ShapeString(tensor->shape())));
    }
    targets.push_back({&value, tensor});
  }
  for (const Target& t : targets) {
    OPTSTEP_RETURN_IF_ERROR(device_->CopyFromHost(t.value->bytes.data(), DType::kF32,
                                                  t.tensor->numel(), *t.tensor, 0));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (has_group_step[g]) groups_[g].applied_steps = group_steps[g];
  }
  absl::MutexLock lock(&mu_);
  if (has_step) step_ = step;
  if (has_skipped) skipped_steps_ = skipped;
  snapshots_.clear();
  last_outcome_.reset();
  ++generation_;
  return absl::OkStatus();
}

}  // namespace optstep
