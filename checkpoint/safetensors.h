#ifndef OPTSTEP_CHECKPOINT_SAFETENSORS_H_
#define OPTSTEP_CHECKPOINT_SAFETENSORS_H_

// The header of a safetensors file (https://github.com/huggingface/safetensors, "Format"):
//
//   8 bytes      N, unsigned little-endian: the length of the JSON header
//   N bytes      UTF-8 JSON object {"<key>": {"dtype": "F32", "shape": [2, 3],
//                "data_offsets": [begin, end]}, ..., "__metadata__": {"<k>": "<v>"}}
//                (may be padded at the end with spaces)
//   the rest     the data section; offsets are relative to its start
//
// Checkpoints use the dtypes F32 and I64 only. Parsing enforces the official rules: the header
// is a JSON object of at most kMaxSafetensorsHeaderBytes, every tensor's byte range matches its
// shape and dtype, ranges do not overlap and cover the data section without holes. Stateless.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/state_dict.h"
#include "kernels/tensor.h"

namespace optstep {

// The official reader's limit on N.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string key;
  StateTensor::Type type = StateTensor::Type::kF32;
  Shape shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order (ascending `begin`)
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + N
};

// "F32" / "I64", and the element size in bytes.
const char* SafetensorsDType(StateTensor::Type type);
size_t ElementSize(StateTensor::Type type);

// The 8-byte length prefix followed by the JSON header (padded with spaces so that the data
// section starts at a multiple of 8) for `entries` laid out in the given order, contiguous from
// offset 0: sets each entry's begin/end. Keys are kept as given; "__metadata__" is reserved.
// INVALID_ARGUMENT for a duplicate, empty or reserved key or a negative dimension.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata);

// Reads N from the first 8 bytes of a file of `file_size` bytes. DATA_LOSS when the file is
// shorter than 8 bytes or N is out of bounds (< 2, > kMaxSafetensorsHeaderBytes, or past the
// end of the file). `file` names the file in messages.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view prefix8, uint64_t file_size,
                                                      absl::string_view file);

// Parses the JSON header `json` (the N bytes after the prefix) of a file of `file_size` bytes.
// DATA_LOSS naming the file, the key and the value for malformed JSON or entries, offsets out of
// range, overlapping or leaving holes; INVALID_ARGUMENT for a dtype other than F32 and I64.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t file_size,
                                                         absl::string_view file);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_SAFETENSORS_H_
