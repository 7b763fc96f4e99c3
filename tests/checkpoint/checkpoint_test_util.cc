#include "tests/checkpoint/checkpoint_test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace testutil {

OwnedTensor F32Tensor(std::string key, Shape shape, float start) {
  OwnedTensor t{std::move(key), StateTensor::Type::kF32, std::move(shape), {}};
  const int64_t n = NumElements(t.shape);
  t.bytes.resize(n * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + static_cast<float>(i) * 0.25f;
    std::memcpy(&t.bytes[i * sizeof(float)], &v, sizeof(v));
  }
  return t;
}

OwnedTensor I64Scalar(std::string key, int64_t value) {
  OwnedTensor t{std::move(key), StateTensor::Type::kI64, {}, {}};
  t.bytes.assign(reinterpret_cast<const char*>(&value), sizeof(value));
  return t;
}

Manifest SampleManifest(int world_size, const std::vector<int>& owners) {
  Manifest m;
  m.definition = R"({"name": "sample", "trainers": 1, "params": ["w0", "b0", "w1", "emb"]})";
  m.optimizer = R"({"sub_optimizers": ["adamw", "soap"], "groups": [{"id": 0}, {"id": 1}]})";
  m.world_size = world_size;
  m.step = 7;
  m.skipped_steps = 1;
  m.session_id = "s0123";
  m.session_owner = "alice";
  m.params = {{"w0", {4, 3}, 0, owners[0], 12},
              {"b0", {3}, 0, owners[1], 3},
              {"w1", {2, 5}, 1, owners[2], 10},
              {"emb", {6, 4}, 1, owners[3], 24}};
  return m;
}

std::vector<std::vector<OwnedTensor>> SampleShards(int world_size, const std::vector<int>& owners) {
  std::vector<std::vector<OwnedTensor>> shards(world_size);
  auto owned = [&](int p, OwnedTensor t) { shards[owners[p]].push_back(std::move(t)); };
  owned(0, F32Tensor("param/w0", {4, 3}, 1.0f));
  owned(0, F32Tensor("state/adamw/w0/exp_avg", {4, 3}, -2.0f));
  owned(0, F32Tensor("state/adamw/w0/exp_avg_sq", {4, 3}, 0.5f));
  owned(1, F32Tensor("param/b0", {3}, 9.0f));
  owned(1, F32Tensor("state/adamw/b0/exp_avg", {3}, 0.0f));
  owned(1, F32Tensor("state/adamw/b0/exp_avg_sq", {3}, 3.0f));
  owned(2, F32Tensor("param/w1", {2, 5}, -7.0f));
  owned(2, F32Tensor("state/soap/w1/L", {2, 2}, 4.0f));  // not the parameter's shape
  owned(2, F32Tensor("state/soap/w1/R", {5, 5}, 5.0f));
  owned(2, F32Tensor("state/soap/w1/exp_avg", {2, 5}, 6.0f));
  owned(2, I64Scalar("state/soap/w1/step", 7));
  owned(3, F32Tensor("param/emb", {6, 4}, 100.0f));
  owned(3, F32Tensor("state/adamw/emb/exp_avg", {6, 4}, -100.0f));
  owned(3, F32Tensor("state/adamw/emb/empty", {0, 4}, 0.0f));
  for (auto& shard : shards) {
    shard.push_back(I64Scalar("state/adamw/group0/step", 6));
    shard.push_back(I64Scalar("state/soap/group1/step", 7));
    shard.push_back(I64Scalar("meta/step", 7));
    shard.push_back(I64Scalar("meta/skipped_steps", 1));
  }
  return shards;
}

absl::Status WriteCheckpoint(absl::string_view root, absl::string_view name, Manifest manifest,
                             const std::vector<std::vector<OwnedTensor>>& shards, int keep_last,
                             const CheckpointIoOptions& options) {
  const uint64_t save = NewCheckpointSave();
  OPTSTEP_RETURN_IF_ERROR(PrepareCheckpoint(root, name, save));
  manifest.shards.clear();
  for (size_t r = 0; r < shards.size(); ++r) {
    std::vector<TensorSource> sources;
    for (size_t i = 0; i < shards[r].size(); ++i) {
      const OwnedTensor& t = shards[r][i];
      TensorSource source{t.key, t.type, t.shape};
      if (i % 2 == 0) {
        source.data = t.bytes.data();
      } else {
        source.read = [&t](uint64_t offset, size_t n, void* dst) {
          std::memcpy(dst, t.bytes.data() + offset, n);
          return absl::OkStatus();
        };
      }
      sources.push_back(std::move(source));
    }
    OPTSTEP_ASSIGN_OR_RETURN(
        ShardFile file,
        WriteCheckpointShard(root, name, save, static_cast<int>(r), static_cast<int>(shards.size()),
                             sources, nullptr, options));
    manifest.shards.push_back({file.file, file.bytes, file.crc32c});
  }
  return CommitCheckpoint(root, name, save, manifest, keep_last);
}

absl::StatusOr<std::string> ReadBytes(const CheckpointReader& reader, absl::string_view key) {
  const CheckpointTensor* t = reader.Find(key);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no tensor '", key, "'"));
  std::string bytes(t->bytes, '\0');
  OPTSTEP_RETURN_IF_ERROR(reader.Read(*t, bytes.data()));
  return bytes;
}

std::string FreshDir(absl::string_view label) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", label, "-", ++counter);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

}  // namespace testutil
}  // namespace optstep
