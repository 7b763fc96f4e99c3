#include "checkpoint/reshard.h"

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/partition.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/temporaries.h"

namespace optstep {
namespace {

constexpr int kReplicated = -1;

// The parameter id a key belongs to, by exact name; kReplicated for keys of no parameter.
int ParamOfKey(const std::string& key, const std::map<std::string, int>& param_of) {
  const std::optional<std::string> name = ParamNameOfKey(key);
  if (!name) return kReplicated;
  auto it = param_of.find(*name);
  return it == param_of.end() ? kReplicated : it->second;
}

// FAILED_PRECONDITION unless two copies of a key agree in dtype, shape and bytes.
absl::Status CheckSameCopy(const CheckpointReader& src, const CheckpointTensor& a,
                           const CheckpointTensor& b) {
  auto differ = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", a.key, "' differs in ", what, " between shards ", a.shard, " and ", b.shard));
  };
  if (a.type != b.type || a.shape != b.shape) return differ("dtype or shape");
  constexpr size_t kPiece = 1 << 20;
  std::vector<char> x(kPiece), y(kPiece);
  for (uint64_t offset = 0; offset < a.bytes; offset += kPiece) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, a.bytes - offset));
    OPTSTEP_RETURN_IF_ERROR(src.ReadRange(a, offset, n, x.data()));
    OPTSTEP_RETURN_IF_ERROR(src.ReadRange(b, offset, n, y.data()));
    if (std::memcmp(x.data(), y.data(), n) != 0) return differ("contents");
  }
  return absl::OkStatus();
}

// Writes shard r of `sources` for every r and records each in `out.shards`; `total` counts the
// bytes and files of every shard, for the progress.
absl::Status WriteShards(absl::string_view dst_root, absl::string_view dst_name, uint64_t save,
                         const std::vector<std::vector<TensorSource>>& sources,
                         CheckpointProgress total, const CheckpointProgressCallback& progress,
                         Manifest& out) {
  const int world_size = static_cast<int>(sources.size());
  for (int r = 0; r < world_size; ++r) {
    auto shard_progress = [&, before = total](const CheckpointProgress& p) {
      if (!progress) return;
      CheckpointProgress now = before;
      now.bytes_done += p.bytes_done;
      now.files_done += p.files_done;
      progress(now);
    };
    OPTSTEP_ASSIGN_OR_RETURN(
        ShardFile file,
        WriteCheckpointShard(dst_root, dst_name, save, r, world_size, sources[r], shard_progress));
    total.bytes_done += file.bytes;
    ++total.files_done;
    out.shards.push_back({file.file, file.bytes, file.crc32c});
  }
  return absl::OkStatus();
}

absl::Status Reshard(const CheckpointReader& src, absl::string_view dst_root,
                     absl::string_view dst_name, int world_size, const std::vector<int>& owners,
                     const CheckpointProgressCallback& progress) {
  const Manifest& in = src.manifest();
  std::map<std::string, int> param_of;
  for (size_t p = 0; p < in.params.size(); ++p) param_of[in.params[p].name] = static_cast<int>(p);

  // Each key once (the lowest rank's copy), after checking that other copies agree.
  std::map<std::string, std::vector<const CheckpointTensor*>> copies;
  for (int r = 0; r < in.world_size; ++r) {
    for (const CheckpointTensor& t : src.ShardTensors(r)) copies[t.key].push_back(&t);
  }
  std::vector<std::vector<const CheckpointTensor*>> per_shard(world_size);
  for (const auto& [key, list] : copies) {
    for (size_t i = 1; i < list.size(); ++i) {
      OPTSTEP_RETURN_IF_ERROR(CheckSameCopy(src, *list[0], *list[i]));
    }
    const int p = ParamOfKey(key, param_of);
    if (p == kReplicated) {
      for (auto& shard : per_shard) shard.push_back(list[0]);
    } else {
      per_shard[owners[p]].push_back(list[0]);
    }
  }

  Manifest out = in;
  out.world_size = world_size;
  for (size_t p = 0; p < out.params.size(); ++p) out.params[p].owner = owners[p];
  out.shards.clear();

  std::vector<std::vector<TensorSource>> sources(world_size);
  CheckpointProgress total;
  total.files_total = world_size;
  for (int r = 0; r < world_size; ++r) {
    std::vector<SafetensorsEntry> entries;
    for (const CheckpointTensor* t : per_shard[r]) {
      TensorSource source{t->key, t->type, t->shape};
      source.read = [&src, t](uint64_t offset, size_t n, void* dst) {
        return src.ReadRange(*t, offset, n, dst);
      };
      sources[r].push_back(std::move(source));
      entries.push_back({t->key, t->type, t->shape});
      total.bytes_total += t->bytes;
    }
    OPTSTEP_ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, {}));
    total.bytes_total += header.size();
  }
  const uint64_t save = NewCheckpointSave();
  OPTSTEP_RETURN_IF_ERROR(PrepareCheckpoint(dst_root, dst_name, save));
  absl::Status written = WriteShards(dst_root, dst_name, save, sources, total, progress, out);
  if (!written.ok()) {
    // A shard failed (its own file is gone already): the temporary goes with everything in it.
    (void)AbandonCheckpoint(dst_root, dst_name, save);
    return written;
  }
  return CommitCheckpoint(dst_root, dst_name, save, out, /*keep_last=*/0);
}

}  // namespace

absl::Status MergeCheckpoint(const CheckpointReader& src, absl::string_view dst_root,
                             absl::string_view dst_name,
                             const CheckpointProgressCallback& progress) {
  return Reshard(src, dst_root, dst_name, 1, std::vector<int>(src.manifest().params.size(), 0),
                 progress);
}

absl::Status SplitCheckpoint(const CheckpointReader& src, absl::string_view dst_root,
                             absl::string_view dst_name, int world_size,
                             const CheckpointProgressCallback& progress) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("split into ", world_size, " ranks: need at least 1"));
  }
  std::vector<double> costs;
  for (const ManifestParam& p : src.manifest().params) costs.push_back(p.cost);
  return Reshard(src, dst_root, dst_name, world_size, PartitionByCost(costs, world_size).owner,
                 progress);
}

}  // namespace optstep
