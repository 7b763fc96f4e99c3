#ifndef OPTSTEP_CHECKPOINT_RESHARD_H_
#define OPTSTEP_CHECKPOINT_RESHARD_H_

// Offline resharding of a checkpoint onto another number of ranks. Both functions write a new,
// complete checkpoint <dst_root>/<dst_name> (Prepare / WriteShard / Commit) with a new manifest
// and leave the source untouched. Tensors are streamed, never held whole in memory.
//
// Tensor ownership: "param/<name>" and "state/<sub>/<name>/<key>" belong to parameter <name>
// (exact name match) and go to the shard of its owner; every other tensor (group step counters,
// "meta/...") is replicated into every shard, as every rank of a session holds them. A key
// found in several source shards must hold the same bytes there (FAILED_PRECONDITION naming the
// key otherwise).

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"

namespace optstep {

// One shard, every parameter owned by rank 0.
absl::Status MergeCheckpoint(const CheckpointReader& src, absl::string_view dst_root,
                             absl::string_view dst_name,
                             const CheckpointProgressCallback& progress = nullptr);

// `world_size` shards; owners from PartitionByCost over the manifest's parameter costs.
// INVALID_ARGUMENT for world_size < 1.
absl::Status SplitCheckpoint(const CheckpointReader& src, absl::string_view dst_root,
                             absl::string_view dst_name, int world_size,
                             const CheckpointProgressCallback& progress = nullptr);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_RESHARD_H_
