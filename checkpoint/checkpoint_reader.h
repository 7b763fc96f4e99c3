#ifndef OPTSTEP_CHECKPOINT_CHECKPOINT_READER_H_
#define OPTSTEP_CHECKPOINT_CHECKPOINT_READER_H_

// Reading a checkpoint directory: Open parses and validates manifest.json and every shard's
// safetensors header (sizes, offsets, dtypes, shapes); Verify checks every shard's CRC-32C;
// tensors are looked up by exact key across all shards and streamed into a destination
// through a bounded buffer. Immutable after Open, thread-safe (reads use pread).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"

namespace optstep {

// Receives `n` bytes of a tensor's contents that start at `byte_offset` of the tensor.
using TensorByteWriter =
    std::function<absl::Status(uint64_t byte_offset, size_t n, const void* src)>;

// Where a tensor lies.
struct CheckpointTensor {
  std::string key;
  StateTensor::Type type = StateTensor::Type::kF32;
  Shape shape;
  int shard = 0;             // rank of the file that holds it
  uint64_t file_offset = 0;  // of its first byte in that file
  uint64_t bytes = 0;
};

class CheckpointReader final {
 public:
  // Opens <root>/<name> (INVALID_ARGUMENT for a bad name, see ValidateCheckpointName).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      absl::string_view root, absl::string_view name, const CheckpointIoOptions& options = {});
  // Opens the checkpoint directory `dir`. NOT_FOUND when `dir` or its manifest.json is missing;
  // the manifest's codes (ParseManifest); DATA_LOSS naming the file for a missing shard, a
  // size that differs from the manifest's, or a malformed safetensors header; INVALID_ARGUMENT
  // for an unsupported dtype.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenDirectory(
      absl::string_view dir, const CheckpointIoOptions& options = {});

  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }

  // Recomputes every shard's CRC-32C. DATA_LOSS naming the file, the expected and the actual
  // value on a mismatch. Then compares the manifest's `step` and `skipped_steps` with every
  // shard's "meta/step" and "meta/skipped_steps": DATA_LOSS naming the field, both values and
  // the file when they differ (an edited manifest; a shard without those keys is not compared).
  absl::Status Verify(const CheckpointProgressCallback& progress = nullptr) const;

  // Receives a piece of a tensor during ReadShard: bytes [byte_offset, byte_offset + n) of
  // `tensor` at `src` (valid during the call only).
  using ShardTensorSink = std::function<absl::Status(
      const CheckpointTensor& tensor, uint64_t byte_offset, size_t n, const void* src)>;

  // Reads shard `rank` once, front to back, handing every tensor's bytes to `sink` in file order
  // (empty tensors are skipped), and checks the shard's CRC-32C on the way: one pass where
  // Verify + Read take two. The next piece is read while the current one is checksummed and
  // delivered. A mismatch (checksum or step counters, as Verify) is DATA_LOSS after every byte
  // was delivered: the caller must then discard what `sink` received.
  // REQUIRES: 0 <= rank < world size.
  absl::Status ReadShard(int rank, const ShardTensorSink& sink,
                         const CheckpointProgressCallback& progress = nullptr) const;

  // The tensor stored under exactly `key` (the lowest rank's copy when several shards hold
  // it), or nullptr.
  const CheckpointTensor* Find(absl::string_view key) const;
  // Every tensor of shard `rank`, in file order.
  const std::vector<CheckpointTensor>& ShardTensors(int rank) const { return shards_[rank]; }
  // Every distinct key, sorted.
  std::vector<std::string> Keys() const;
  uint64_t TotalTensorBytes() const;

  // Streams the tensor's bytes to `sink` in pieces of at most the staging size.
  absl::Status Read(const CheckpointTensor& tensor, const TensorByteWriter& sink) const;
  // Copies the tensor's bytes to `dst` (tensor.bytes bytes).
  absl::Status Read(const CheckpointTensor& tensor, void* dst) const;
  // Bytes [offset, offset + n) of the tensor into `dst`; OUT_OF_RANGE past its end.
  absl::Status ReadRange(const CheckpointTensor& tensor, uint64_t offset, size_t n,
                         void* dst) const;
  // Find + Read; NOT_FOUND naming the key when absent.
  absl::Status ReadKey(absl::string_view key, void* dst, size_t dst_bytes) const;

 private:
  CheckpointReader(std::string dir, Manifest manifest, CheckpointIoOptions options)
      : dir_(std::move(dir)), manifest_(std::move(manifest)), options_(options) {}
  absl::Status OpenShards();
  // The manifest's step counters against shard `rank`'s "meta/" counters (8 bytes each).
  absl::Status CheckCounters(int rank) const;
  // ReadShard's pass; `report` accumulates over calls (Verify reads every shard).
  absl::Status ScanShard(int rank, const ShardTensorSink& sink, CheckpointProgress& report,
                         const CheckpointProgressCallback& progress) const;

  std::string dir_;
  Manifest manifest_;
  CheckpointIoOptions options_;
  std::vector<int> fds_;                               // one per shard
  std::vector<std::vector<CheckpointTensor>> shards_;  // per rank
  std::map<std::string, const CheckpointTensor*, std::less<>> index_;
};

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_CHECKPOINT_READER_H_
