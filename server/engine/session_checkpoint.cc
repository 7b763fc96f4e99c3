#include "server/engine/session_checkpoint.h"

#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/manifest.h"
#include "nlohmann/json.hpp"
#include "server/engine/cost_model.h"

namespace optstep {
namespace {

// Sub-optimizers and groups as the manifest records them (for people and tools; a load
// matches groups by the definition, whose digest must be equal).
std::string OptimizerJson(const Session& session) {
  nlohmann::json groups = nlohmann::json::array();
  for (const GroupRuntime& g : session.groups()) {
    groups.push_back(
        {{"id", g.def.id},
         {"sub_optimizer", session.config().chain.sub_optimizers[g.def.sub_optimizer].name},
         {"wd_mult", g.def.wd_mult},
         {"expert", g.def.expert},
         {"param_ids", g.def.param_ids}});
  }
  nlohmann::json subs = nlohmann::json::array();
  for (const SubOptimizerConfig& sub : session.config().chain.sub_optimizers) {
    subs.push_back({{"name", sub.name}, {"kind", sub.kind}});
  }
  return nlohmann::json{{"sub_optimizers", subs}, {"groups", groups}}.dump();
}

// The selection a shard holds: masters and optimizer state of the owned parameters, counters.
StateSelection ShardSelection() {
  StateSelection selection;
  selection.params = StateSelection::Params::kOwned;
  return selection;
}

}  // namespace

std::string AutoCheckpointName(const std::string& session_id, uint64_t step) {
  return absl::StrCat(kAutoCheckpointDir, "/", session_id, "/step-", step);
}

std::optional<uint64_t> AutoCheckpointStep(absl::string_view dir_name) {
  uint64_t step = 0;
  if (!absl::ConsumePrefix(&dir_name, "step-") || !absl::SimpleAtoi(dir_name, &step)) {
    return std::nullopt;
  }
  return step;
}

std::string AutoCheckpointRoot(const std::string& root, const std::string& session_id) {
  return absl::StrCat(root, "/", kAutoCheckpointDir, "/", session_id);
}

bool IsAutoCheckpointName(const std::string& name) {
  return absl::StartsWith(name, absl::StrCat(kAutoCheckpointDir, "/"));
}

absl::StatusOr<CheckpointLocation> LocateCheckpoint(const std::string& root,
                                                    const std::string& name, bool allow_auto) {
  if (allow_auto && IsAutoCheckpointName(name)) {
    const std::vector<std::string> parts = absl::StrSplit(name, '/');
    if (parts.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("automatic checkpoint name '", name,
                                                     "' must be 'auto/<session id>/<checkpoint>'"));
    }
    OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(parts[1]));
    OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(parts[2]));
    return CheckpointLocation{AutoCheckpointRoot(root, parts[1]), parts[2]};
  }
  OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(name));
  if (name == kAutoCheckpointDir) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint name '", name, "' is reserved for automatic checkpoints"));
  }
  return CheckpointLocation{root, name};
}

absl::StatusOr<ShardFile> WriteSnapshotShard(Session& session, uint64_t token,
                                             const CheckpointLocation& where, absl::Duration lease,
                                             const std::function<void()>& release) {
  absl::StatusOr<std::shared_ptr<const StateDict>> snapshot =
      session.holds().ExportHeld(token, ShardSelection(), lease);
  release();
  if (!snapshot.ok()) return snapshot.status();
  std::vector<TensorSource> sources;
  sources.reserve((*snapshot)->size());
  for (const auto& [key, tensor] : **snapshot) {
    TensorSource source;
    source.key = key;
    source.type = tensor.type;
    source.shape = tensor.shape;
    source.data = tensor.bytes.data();
    sources.push_back(std::move(source));
  }
  return WriteCheckpointShard(where.root, where.name, token, session.rank(),
                              session.layout().world_size, sources);
}

absl::StatusOr<ShardFile> WriteHeldShard(Session& session, uint64_t token,
                                         const CheckpointLocation& where,
                                         const CheckpointProgressCallback& progress) {
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> tensors,
                           session.holds().HeldTensorsToRead(token, ShardSelection()));
  std::vector<TensorSource> sources;
  sources.reserve(tensors.size());
  for (HeldTensor& t : tensors) {
    TensorSource source;
    source.key = t.key;
    source.type = t.type;
    source.shape = t.shape;
    source.read = std::move(t.read);
    sources.push_back(std::move(source));
  }
  return WriteCheckpointShard(where.root, where.name, token, session.rank(),
                              session.layout().world_size, sources, progress);
}

absl::Status CommitSessionCheckpoint(Session& session, uint64_t token, const HeldPoint& point,
                                     const CheckpointLocation& where,
                                     const std::string& definition_json,
                                     const std::vector<ShardFile>& shards, int keep_last) {
  const SessionConfig& config = session.config();
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<double> costs,
                           EstimateStepCosts(config.chain, config.params));
  Manifest manifest;
  manifest.definition = definition_json;
  manifest.world_size = session.layout().world_size;
  manifest.step = point.step;
  manifest.skipped_steps = point.skipped_steps;
  for (size_t p = 0; p < config.params.size(); ++p) {
    ManifestParam param;
    param.name = config.params[p].name;
    param.shape = config.params[p].shape;
    param.model_chunk = config.params[p].model_chunk;
    param.owner = session.layout().owner[p];
    param.cost = costs[p];
    manifest.params.push_back(std::move(param));
  }
  manifest.optimizer = OptimizerJson(session);
  manifest.session_id = session.id();
  manifest.session_owner = config.owner;
  for (const ShardFile& shard : shards) {
    manifest.shards.push_back(ManifestShard{shard.file, shard.bytes, shard.crc32c});
  }
  return CommitCheckpoint(where.root, where.name, token, manifest, keep_last);
}

absl::StatusOr<uint64_t> StageCheckpoint(Session& session, uint64_t token,
                                         const CheckpointLocation& where,
                                         const std::string& definition_json,
                                         const CheckpointProgressCallback& progress) {
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                           CheckpointReader::Open(where.root, where.name));
  const Manifest& manifest = reader->manifest();
  OPTSTEP_ASSIGN_OR_RETURN(std::string digest, DefinitionDigest(definition_json));
  if (digest != manifest.definition_digest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", where.name, "' was saved from another session definition (digest ",
        manifest.definition_digest, "); session '", session.id(), "' has ", digest));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::vector<HeldTensor> wanted,
                           session.holds().HeldTensors(token, StateSelection{}));
  // Every wanted tensor is checked against the shards' headers first; then each shard is read
  // once, front to back, its CRC-32C and counters checked on the way (ReadShard), and the wanted
  // copies (the lowest rank's, as Find answers) land in the state as they pass.
  auto state = std::make_shared<StateDict>();
  std::map<const CheckpointTensor*, StateTensor*> targets;
  for (const HeldTensor& t : wanted) {
    const CheckpointTensor* found = reader->Find(t.key);
    if (found == nullptr) {
      return absl::DataLossError(absl::StrCat("checkpoint '", where.name, "' lacks tensor '", t.key,
                                              "' that session '", session.id(), "' needs"));
    }
    if (found->type != t.type || found->shape != t.shape) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint '", where.name, "': tensor '", t.key, "' has shape ",
          ShapeString(found->shape), (found->type == StateTensor::Type::kI64 ? " I64" : " F32"),
          "; the session expects ", ShapeString(t.shape),
          (t.type == StateTensor::Type::kI64 ? " I64" : " F32")));
    }
    StateTensor& out = (*state)[t.key];
    out.type = t.type;
    out.shape = t.shape;
    out.bytes.resize(found->bytes);
    targets[found] = &out;
  }
  const auto sink = [&targets](const CheckpointTensor& tensor, uint64_t byte_offset, size_t n,
                               const void* src) {
    auto it = targets.find(&tensor);
    if (it != targets.end()) std::memcpy(it->second->bytes.data() + byte_offset, src, n);
    return absl::OkStatus();
  };
  CheckpointProgress done;  // of the shards before the one being read
  done.files_total = static_cast<int>(manifest.shards.size());
  for (const ManifestShard& shard : manifest.shards) done.bytes_total += shard.bytes;
  for (int r = 0; r < done.files_total; ++r) {
    OPTSTEP_RETURN_IF_ERROR(reader->ReadShard(r, sink, [&](const CheckpointProgress& p) {
      if (!progress) return;
      CheckpointProgress all = done;
      all.bytes_done += p.bytes_done;
      all.files_done += p.files_done;
      progress(all);
    }));
    done.bytes_done += manifest.shards[r].bytes;
    ++done.files_done;
  }
  OPTSTEP_RETURN_IF_ERROR(session.holds().StageState(token, std::move(state), /*complete=*/true));
  return manifest.step;
}

}  // namespace optstep
