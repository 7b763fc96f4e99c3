#ifndef OPTSTEP_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define OPTSTEP_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

// Helpers of the checkpoint tests: tensors with owned bytes and deterministic values, a small
// session-like manifest, and writing a whole checkpoint the way the ranks do
// (Prepare / WriteShard per rank / Commit). Test-only.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/manifest.h"

namespace optstep {
namespace testutil {

struct OwnedTensor {
  std::string key;
  StateTensor::Type type = StateTensor::Type::kF32;
  Shape shape;
  std::string bytes;
};

// fp32 tensor whose element i is `start + i * 0.25` (exact in fp32 for small i).
OwnedTensor F32Tensor(std::string key, Shape shape, float start);
// 0-d int64 tensor.
OwnedTensor I64Scalar(std::string key, int64_t value);

// Parameters "w0" [4, 3], "b0" [3], "w1" [2, 5], "emb" [6, 4] with costs 12, 3, 10, 24 and the
// given owners; world_size from `world_size`; step 7, 1 skipped.
Manifest SampleManifest(int world_size, const std::vector<int>& owners);

// The parameters, AdamW and SOAP-like state (non-parameter-shaped factor, 0-d counters) and
// the meta counters of SampleManifest, split by `owners` (replicated keys on every rank).
std::vector<std::vector<OwnedTensor>> SampleShards(int world_size, const std::vector<int>& owners);

// Writes every rank's shard (host pointers for even positions, reader callbacks for odd ones,
// so that both paths run) and commits with `manifest`'s shard entries filled in.
absl::Status WriteCheckpoint(absl::string_view root, absl::string_view name, Manifest manifest,
                             const std::vector<std::vector<OwnedTensor>>& shards, int keep_last = 0,
                             const CheckpointIoOptions& options = {});

// Reads the whole tensor stored under `key`.
absl::StatusOr<std::string> ReadBytes(const CheckpointReader& reader, absl::string_view key);

// A fresh empty directory under the test's temporary directory.
std::string FreshDir(absl::string_view label);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
