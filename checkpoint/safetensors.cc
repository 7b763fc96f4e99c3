#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/json_depth.h"
#include "nlohmann/json.hpp"

namespace optstep {
namespace {

constexpr char kMetadataKey[] = "__metadata__";
// A header is 3 deep ({"key": {"shape": [...]}}); a little room for metadata.
constexpr size_t kMaxHeaderDepth = 8;

absl::Status Loss(absl::string_view file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", file, "': ", what));
}

// Shapes and offsets are non-negative integers that fit in int64 (uint64 for offsets).
bool AsUint64(const nlohmann::json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

const char* SafetensorsDType(StateTensor::Type type) {
  return type == StateTensor::Type::kI64 ? "I64" : "F32";
}

size_t ElementSize(StateTensor::Type type) {
  return type == StateTensor::Type::kI64 ? sizeof(int64_t) : sizeof(float);
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (SafetensorsEntry& entry : entries) {
    if (entry.key.empty() || entry.key == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor key '", entry.key, "' is empty or reserved"));
    }
    if (header.contains(entry.key)) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor key '", entry.key, "'"));
    }
    for (int64_t d : entry.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", entry.key, "': negative dimension in shape ", ShapeString(entry.shape)));
      }
    }
    entry.begin = offset;
    entry.end = offset + static_cast<uint64_t>(NumElements(entry.shape)) * ElementSize(entry.type);
    offset = entry.end;
    header[entry.key] = {{"dtype", SafetensorsDType(entry.type)},
                         {"shape", entry.shape},
                         {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += json;
  return out;
}

absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view prefix8, uint64_t file_size,
                                                      absl::string_view file) {
  if (prefix8.size() < 8 || file_size < 8) {
    return Loss(file, absl::StrCat("file of ", file_size,
                                   " bytes is shorter than the 8-byte "
                                   "header length"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<uint8_t>(prefix8[i])) << (8 * i);
  if (n < 2 || n > kMaxSafetensorsHeaderBytes || n > file_size - 8) {
    return Loss(file, absl::StrCat("header length ", n, " is out of bounds [2, ",
                                   std::min<uint64_t>(kMaxSafetensorsHeaderBytes, file_size - 8),
                                   "] for a file of ", file_size, " bytes"));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view json, uint64_t file_size,
                                                         absl::string_view file) {
  if (file_size < 8 + static_cast<uint64_t>(json.size())) {
    return Loss(file, absl::StrCat("header of ", json.size(), " bytes does not fit in ", file_size,
                                   " bytes"));
  }
  if (json.empty() || json[0] != '{') return Loss(file, "header does not start with '{'");
  // A header is an object of objects of flat arrays; printing a deeper one (an error message)
  // recurses once per level.
  if (const size_t depth = JsonNestingDepth(json); depth > kMaxHeaderDepth) {
    return Loss(file, absl::StrCat("header nests ", depth, " levels deep, over ", kMaxHeaderDepth));
  }
  nlohmann::json header = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Loss(file, "header is not a JSON object");
  }
  SafetensorsHeader out;
  out.data_start = 8 + json.size();
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& item : header.items()) {
    // Named copies, not structured bindings: lambdas below capture them (C++17).
    const std::string& key = item.key();
    const nlohmann::json& value = item.value();
    if (key == kMetadataKey) {
      if (!value.is_object()) return Loss(file, "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          return Loss(file, absl::StrCat("__metadata__ value of '", k, "' is not a string"));
        }
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) {
      return Loss(file, absl::StrCat("tensor '", key, "': ", what));
    };
    if (!value.is_object()) return bad("entry is not an object");
    SafetensorsEntry entry;
    entry.key = key;
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) return bad("dtype missing or not a string");
    const std::string type = dtype->get<std::string>();
    if (type == "F32") {
      entry.type = StateTensor::Type::kF32;
    } else if (type == "I64") {
      entry.type = StateTensor::Type::kI64;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("safetensors file '", file, "': tensor '", key,
                                                     "' has dtype '", type,
                                                     "'; checkpoints hold F32 and I64 only"));
    }
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) return bad("shape missing or not an array");
    // numel * element size must stay below 2^63: dimensions are bounded by the data size.
    uint64_t numel = 1;
    bool overflow = false;
    for (const nlohmann::json& d : *shape) {
      uint64_t dim = 0;
      if (!AsUint64(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return bad(absl::StrCat("shape ", shape->dump(),
                                " has an entry that is not a "
                                "non-negative integer"));
      }
      entry.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && numel > (uint64_t{1} << 60) / dim) overflow = true;
      numel *= dim;
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !AsUint64((*offsets)[0], &entry.begin) || !AsUint64((*offsets)[1], &entry.end)) {
      return bad("data_offsets is not a pair of non-negative integers");
    }
    if (entry.begin > entry.end || entry.end > data_size) {
      return bad(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end,
                              "] out of range of the ", data_size, "-byte data section"));
    }
    if (overflow || numel * ElementSize(entry.type) != entry.end - entry.begin) {
      return bad(absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] hold ",
                              entry.end - entry.begin, " bytes, not the ", type, " shape ",
                              shape->dump()));
    }
    out.entries.push_back(std::move(entry));
  }
  std::sort(out.entries.begin(), out.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  for (const SafetensorsEntry& entry : out.entries) {
    if (entry.begin != expected) {
      return Loss(
          file, absl::StrCat(
                    "tensor '", entry.key, "' at data_offsets [", entry.begin, ", ", entry.end,
                    "] ", entry.begin < expected ? "overlaps the previous tensor" : "leaves a hole",
                    " (expected begin ", expected, ")"));
    }
    expected = entry.end;
  }
  if (expected != data_size) {
    return Loss(file, absl::StrCat("tensors cover ", expected, " of the ", data_size,
                                   " bytes of the data section"));
  }
  return out;
}

}  // namespace optstep
