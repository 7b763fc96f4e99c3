#ifndef OPTSTEP_CHECKPOINT_MANIFEST_H_
#define OPTSTEP_CHECKPOINT_MANIFEST_H_

// manifest.json of a checkpoint directory (docs/checkpoints.md): format version, the session
// definition and its digest, world size, step counters, the parameters in id order with their
// owner rank and cost, the optimizer description, and one entry per shard file. Plain data;
// parsing and serialising are pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace optstep {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kManifestFile[] = "manifest.json";

struct ManifestParam {
  std::string name;
  Shape shape;
  uint32_t model_chunk = 0;
  int owner = 0;      // rank whose shard holds the parameter and its optimizer state
  double cost = 1.0;  // estimated step cost, the partitioner's input
};

struct ManifestShard {
  std::string file;  // "shard-<rank>-of-<world>.safetensors", rank = index in `shards`
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  // The session definition: JSON text, stored as a JSON value. Its digest is
  // DefinitionDigest(definition); a loader compares it with its own definition's digest.
  std::string definition = "{}";
  std::string definition_digest;  // set by SerializeManifest / ParseManifest
  int world_size = 1;
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
  std::vector<ManifestParam> params;  // index = parameter id
  std::string optimizer = "{}";       // sub-optimizers and groups: opaque JSON text
  std::vector<ManifestShard> shards;  // index = rank; world_size entries
  // The session that saved it and that session's owner (optional: "" when not recorded, as in
  // checkpoints of earlier releases). Pruning (CommitCheckpoint's keep_last) counts only the
  // checkpoints of the same session, so that one session's saves never remove another's.
  std::string session_id;
  std::string session_owner;
};

// "sha256:<64 hex digits>" of the canonical form of the JSON text `definition_json` (compact,
// object keys sorted, as nlohmann::json::dump() writes it), so that formatting does not matter.
// INVALID_ARGUMENT when the text is not JSON.
absl::StatusOr<std::string> DefinitionDigest(absl::string_view definition_json);

// "shard-<rank>-of-<world>.safetensors".
std::string ShardFileName(int rank, int world_size);

// The manifest as pretty-printed JSON. Checks it first (CheckManifest) and fills in the digest.
absl::StatusOr<std::string> SerializeManifest(const Manifest& manifest);

// Parses manifest.json. FAILED_PRECONDITION naming the version for a format_version other than
// kCheckpointFormatVersion; DATA_LOSS naming the field for malformed JSON, a missing or
// mistyped field, or a value that contradicts another (see CheckManifest), including a digest
// that does not match the stored definition.
absl::StatusOr<Manifest> ParseManifest(absl::string_view json);

// The consistency rules, also applied before writing (then INVALID_ARGUMENT): world_size >= 1,
// one shard per rank named ShardFileName(rank, world_size), unique non-empty parameter names,
// owners in [0, world_size), non-negative dimensions, finite non-negative costs, definition
// and optimizer valid JSON.
absl::Status CheckManifest(const Manifest& manifest, absl::StatusCode code);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_MANIFEST_H_
