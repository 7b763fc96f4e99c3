#include "checkpoint/manifest.h"

#include <openssl/sha.h>

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json_depth.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace optstep {
namespace {

using nlohmann::json;

// Deeper than any manifest, definition or optimizer configuration: printing the value (the
// digest, the fields kept as text) recurses once per level.
constexpr size_t kMaxJsonDepth = 64;

absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view what,
                               absl::StatusCode code) {
  if (const size_t depth = JsonNestingDepth(text); depth > kMaxJsonDepth) {
    return absl::Status(code, absl::StrCat("manifest field '", what, "' nests ", depth,
                                           " levels deep, over ", kMaxJsonDepth));
  }
  json value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::Status(code, absl::StrCat("manifest field '", what, "' is not valid JSON"));
  }
  return value;
}

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  std::string hex = "sha256:";
  for (unsigned char b : digest) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

// Field access for ParseManifest: every failure is DATA_LOSS naming the field's path.
class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}

  absl::Status Missing(const std::string& field, absl::string_view want) const {
    return absl::DataLossError(
        absl::StrCat("manifest field '", path_, field, "' is missing or not ", want));
  }

  absl::StatusOr<const json*> Get(const json& object, const std::string& field, json::value_t type,
                                  absl::string_view want) const {
    auto it = object.find(field);
    bool ok = it != object.end();
    if (ok) {
      const bool number_ok = type == json::value_t::number_unsigned && it->is_number_integer() &&
                             !it->is_number_float() &&
                             (it->is_number_unsigned() || it->get<int64_t>() >= 0);
      const bool float_ok = type == json::value_t::number_float && it->is_number();
      ok = number_ok || float_ok || it->type() == type;
    }
    if (!ok) return Missing(field, want);
    return &*it;
  }

  absl::StatusOr<uint64_t> Unsigned(const json& object, const std::string& field) const {
    OPTSTEP_ASSIGN_OR_RETURN(const json* v, Get(object, field, json::value_t::number_unsigned,
                                                "a non-negative integer"));
    return v->get<uint64_t>();
  }

  absl::StatusOr<int> Int(const json& object, const std::string& field) const {
    OPTSTEP_ASSIGN_OR_RETURN(uint64_t v, Unsigned(object, field));
    if (v > 1u << 30) {
      return absl::DataLossError(
          absl::StrCat("manifest field '", path_, field, "' = ", v, " is out of range"));
    }
    return static_cast<int>(v);
  }

  absl::StatusOr<std::string> String(const json& object, const std::string& field) const {
    OPTSTEP_ASSIGN_OR_RETURN(const json* v, Get(object, field, json::value_t::string, "a string"));
    return v->get<std::string>();
  }

 private:
  std::string path_;
};

absl::StatusOr<ManifestParam> ParseParam(const json& entry, size_t id) {
  const Fields f(absl::StrCat("params[", id, "]."));
  if (!entry.is_object()) return f.Missing("", "an object");
  ManifestParam param;
  OPTSTEP_ASSIGN_OR_RETURN(param.name, f.String(entry, "name"));
  OPTSTEP_ASSIGN_OR_RETURN(const json* shape,
                           f.Get(entry, "shape", json::value_t::array, "an array"));
  for (const json& d : *shape) {
    if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<int64_t>() < 0)) {
      return f.Missing("shape", "an array of non-negative integers");
    }
    param.shape.push_back(d.get<int64_t>());
  }
  OPTSTEP_ASSIGN_OR_RETURN(uint64_t chunk, f.Unsigned(entry, "model_chunk"));
  if (chunk > UINT32_MAX) return f.Missing("model_chunk", "a 32-bit chunk id");
  param.model_chunk = static_cast<uint32_t>(chunk);
  OPTSTEP_ASSIGN_OR_RETURN(param.owner, f.Int(entry, "owner"));
  OPTSTEP_ASSIGN_OR_RETURN(const json* cost,
                           f.Get(entry, "cost", json::value_t::number_float, "a number"));
  param.cost = cost->get<double>();
  return param;
}

absl::StatusOr<ManifestShard> ParseShard(const json& entry, size_t rank) {
  const Fields f(absl::StrCat("shards[", rank, "]."));
  if (!entry.is_object()) return f.Missing("", "an object");
  ManifestShard shard;
  OPTSTEP_ASSIGN_OR_RETURN(shard.file, f.String(entry, "file"));
  OPTSTEP_ASSIGN_OR_RETURN(shard.bytes, f.Unsigned(entry, "bytes"));
  OPTSTEP_ASSIGN_OR_RETURN(std::string crc, f.String(entry, "crc32c"));
  uint32_t value = 0;
  bool ok = crc.size() == 8;
  for (char c : crc) {
    const int digit = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (digit < 0) ok = false;
    value = value << 4 | static_cast<uint32_t>(digit & 0xF);
  }
  if (!ok) return f.Missing("crc32c", "8 lower-case hex digits");
  shard.crc32c = value;
  return shard;
}

}  // namespace

absl::StatusOr<std::string> DefinitionDigest(absl::string_view definition_json) {
  OPTSTEP_ASSIGN_OR_RETURN(
      json value, ParseJson(definition_json, "definition", absl::StatusCode::kInvalidArgument));
  return Sha256Hex(value.dump());
}

std::string ShardFileName(int rank, int world_size) {
  return absl::StrCat("shard-", rank, "-of-", world_size, ".safetensors");
}

absl::Status CheckManifest(const Manifest& m, absl::StatusCode code) {
  auto fail = [code](absl::string_view what) {
    return absl::Status(code, absl::StrCat("manifest: ", what));
  };
  if (m.world_size < 1) return fail(absl::StrCat("world_size ", m.world_size, " is below 1"));
  if (m.shards.size() != static_cast<size_t>(m.world_size)) {
    return fail(absl::StrCat(m.shards.size(), " shards for world_size ", m.world_size));
  }
  for (int r = 0; r < m.world_size; ++r) {
    if (m.shards[r].file != ShardFileName(r, m.world_size)) {
      return fail(absl::StrCat("shards[", r, "].file '", m.shards[r].file, "' is not '",
                               ShardFileName(r, m.world_size), "'"));
    }
  }
  std::set<std::string> names;
  for (size_t p = 0; p < m.params.size(); ++p) {
    const ManifestParam& param = m.params[p];
    if (param.name.empty() || !names.insert(param.name).second) {
      return fail(absl::StrCat("params[", p, "].name '", param.name, "' is empty or repeated"));
    }
    if (param.owner < 0 || param.owner >= m.world_size) {
      return fail(absl::StrCat("params[", p, "] '", param.name, "': owner ", param.owner,
                               " is not a rank of world_size ", m.world_size));
    }
    for (int64_t d : param.shape) {
      if (d < 0) {
        return fail(absl::StrCat("params[", p, "] '", param.name, "': shape ",
                                 ShapeString(param.shape), " has a negative dimension"));
      }
    }
    if (!std::isfinite(param.cost) || param.cost < 0) {
      return fail(absl::StrCat("params[", p, "] '", param.name, "': cost ", param.cost,
                               " is not a finite non-negative number"));
    }
  }
  OPTSTEP_RETURN_IF_ERROR(ParseJson(m.definition, "definition", code).status());
  OPTSTEP_RETURN_IF_ERROR(ParseJson(m.optimizer, "optimizer", code).status());
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeManifest(const Manifest& m) {
  OPTSTEP_RETURN_IF_ERROR(CheckManifest(m, absl::StatusCode::kInvalidArgument));
  json definition = json::parse(m.definition);
  json params = json::array();
  for (const ManifestParam& p : m.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"model_chunk", p.model_chunk},
                      {"owner", p.owner},
                      {"cost", p.cost}});
  }
  json shards = json::array();
  for (const ManifestShard& s : m.shards) {
    shards.push_back(
        {{"file", s.file}, {"bytes", s.bytes}, {"crc32c", absl::StrFormat("%08x", s.crc32c)}});
  }
  json out = {{"format_version", m.format_version},
              {"definition_digest", Sha256Hex(definition.dump())},
              {"definition", definition},
              {"world_size", m.world_size},
              {"step", m.step},
              {"skipped_steps", m.skipped_steps},
              {"params", params},
              {"optimizer", json::parse(m.optimizer)},
              {"shards", shards}};
  if (!m.session_id.empty()) out["session_id"] = m.session_id;
  if (!m.session_owner.empty()) out["session_owner"] = m.session_owner;
  return out.dump(1) + "\n";
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text) {
  OPTSTEP_ASSIGN_OR_RETURN(json root, ParseJson(text, "(whole file)", absl::StatusCode::kDataLoss));
  const Fields f("");
  if (!root.is_object()) return f.Missing("(root)", "an object");
  Manifest m;
  // The version first: a newer format may change everything else.
  auto version = root.find("format_version");
  if (version == root.end() || !version->is_number_integer()) {
    return f.Missing("format_version", "an integer");
  }
  if (version->get<int64_t>() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint format_version ", version->dump(),
                                                      " is not supported (this build "
                                                      "reads version ",
                                                      kCheckpointFormatVersion, ")"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(m.definition_digest, f.String(root, "definition_digest"));
  auto definition = root.find("definition");
  if (definition == root.end()) return f.Missing("definition", "present");
  m.definition = definition->dump();
  if (Sha256Hex(m.definition) != m.definition_digest) {
    return absl::DataLossError(absl::StrCat("manifest field 'definition_digest' ",
                                            m.definition_digest,
                                            " does not match the stored "
                                            "definition (",
                                            Sha256Hex(m.definition), ")"));
  }
  OPTSTEP_ASSIGN_OR_RETURN(m.world_size, f.Int(root, "world_size"));
  OPTSTEP_ASSIGN_OR_RETURN(m.step, f.Unsigned(root, "step"));
  OPTSTEP_ASSIGN_OR_RETURN(m.skipped_steps, f.Unsigned(root, "skipped_steps"));
  OPTSTEP_ASSIGN_OR_RETURN(const json* params,
                           f.Get(root, "params", json::value_t::array, "an array"));
  for (size_t p = 0; p < params->size(); ++p) {
    OPTSTEP_ASSIGN_OR_RETURN(ManifestParam param, ParseParam((*params)[p], p));
    m.params.push_back(std::move(param));
  }
  auto optimizer = root.find("optimizer");
  if (optimizer == root.end()) return f.Missing("optimizer", "present");
  m.optimizer = optimizer->dump();
  OPTSTEP_ASSIGN_OR_RETURN(const json* shards,
                           f.Get(root, "shards", json::value_t::array, "an array"));
  for (size_t r = 0; r < shards->size(); ++r) {
    OPTSTEP_ASSIGN_OR_RETURN(ManifestShard shard, ParseShard((*shards)[r], r));
    m.shards.push_back(std::move(shard));
  }
  // Optional, as in checkpoints of earlier releases.
  for (auto [field, value] :
       {std::pair{"session_id", &m.session_id}, std::pair{"session_owner", &m.session_owner}}) {
    if (root.contains(field)) {
      OPTSTEP_ASSIGN_OR_RETURN(*value, f.String(root, field));
    }
  }
  OPTSTEP_RETURN_IF_ERROR(CheckManifest(m, absl::StatusCode::kDataLoss));
  return m;
}

}  // namespace optstep
