#include "server/engine/chained_state_dict.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

bool SameTensor(const StateTensor& a, const StateTensor& b) {
  return a.type == b.type && a.shape == b.shape && a.bytes == b.bytes;
}

// Adds `from` into `into`; a key present in both must hold the same tensor.
absl::Status Union(const StateDict& from, StateDict& into, const std::string& what) {
  for (const auto& [key, tensor] : from) {
    auto [it, fresh] = into.emplace(key, tensor);
    if (!fresh && !SameTensor(it->second, tensor)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", key, "' differs between the dicts that share it"));
    }
  }
  return absl::OkStatus();
}

// The chunk of the parameter a key belongs to, or nullptr for keys of no parameter.
const uint32_t* ChunkOfKey(const std::string& key,
                           const std::map<std::string, uint32_t>& chunk_of) {
  const std::optional<std::string> name = ParamNameOfKey(key);
  if (!name) return nullptr;
  auto it = chunk_of.find(*name);
  return it == chunk_of.end() ? nullptr : &it->second;
}

}  // namespace

std::string ChunkPrefix(const ChunkedStateDict& dict) {
  return dict.count("model0") > 0 ? "model" : "model_";
}

SubOptimizerChunks ChunkListsOf(const std::vector<ParamInfo>& params,
                                const std::vector<ParamGroup>& groups, int num_sub_optimizers) {
  std::vector<std::set<uint32_t>> sets(num_sub_optimizers);
  for (const ParamGroup& group : groups) {
    for (int p : group.param_ids) sets[group.sub_optimizer].insert(params[p].model_chunk);
  }
  SubOptimizerChunks lists;
  for (const auto& s : sets) lists.emplace_back(s.begin(), s.end());
  return lists;
}

std::vector<uint32_t> ChainChunkList(const SubOptimizerChunks& sub_chunks) {
  std::vector<uint32_t> chain;
  for (const auto& list : sub_chunks) {
    for (uint32_t chunk : list) {
      if (std::find(chain.begin(), chain.end(), chunk) == chain.end()) chain.push_back(chunk);
    }
  }
  return chain;
}

absl::StatusOr<std::vector<ChunkViews>> SplitChunkedStateDictViews(
    const ChunkedStateDict& dict, const SubOptimizerChunks& sub_chunks) {
  const std::vector<uint32_t> chain = ChainChunkList(sub_chunks);
  std::vector<ChunkViews> out(sub_chunks.size());
  if (chain.size() == 1) {
    // The single-chunk rule: every sub-optimizer gets the whole dict (the old bug gave it only
    // to the first, and the others re-seeded their masters from the low-precision model).
    for (ChunkViews& o : out) {
      for (const auto& [key, chunk] : dict) o.emplace_back(key, &chunk);
    }
    return out;
  }
  const std::string prefix = ChunkPrefix(dict);
  for (size_t j = 0; j < sub_chunks.size(); ++j) {
    for (size_t i = 0; i < sub_chunks[j].size(); ++i) {
      const size_t k = std::find(chain.begin(), chain.end(), sub_chunks[j][i]) - chain.begin();
      const std::string key = absl::StrCat(prefix, k);
      auto it = dict.find(key);
      if (it == dict.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "state dict has no key '", key, "' for chunk ", sub_chunks[j][i], " of sub-optimizer ",
            j, " (local index ", i, "); the dict has ", dict.size(), " chunk keys"));
      }
      out[j].emplace_back(absl::StrCat(prefix, i), &it->second);
    }
  }
  return out;
}

absl::StatusOr<std::vector<ChunkedStateDict>> SplitChunkedStateDict(
    const ChunkedStateDict& dict, const SubOptimizerChunks& sub_chunks) {
  const absl::StatusOr<std::vector<ChunkViews>> views =
      SplitChunkedStateDictViews(dict, sub_chunks);
  if (!views.ok()) return views.status();
  std::vector<ChunkedStateDict> out(views->size());
  for (size_t j = 0; j < views->size(); ++j) {
    for (const auto& [key, chunk] : (*views)[j]) out[j][key] = *chunk;
  }
  return out;
}

absl::StatusOr<ChunkedStateDict> MergeChunkedStateDicts(const std::vector<ChunkedStateDict>& dicts,
                                                        const SubOptimizerChunks& sub_chunks) {
  if (dicts.size() != sub_chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("got ", dicts.size(),
                                                   " sub-optimizer state dicts; the chain has ",
                                                   sub_chunks.size(), " sub-optimizers"));
  }
  const std::vector<uint32_t> chain = ChainChunkList(sub_chunks);
  ChunkedStateDict merged;
  for (size_t j = 0; j < dicts.size(); ++j) {
    const std::string prefix = ChunkPrefix(dicts[j]);
    for (const auto& [key, chunk] : dicts[j]) {
      std::string global = key;
      if (chain.size() != 1) {
        size_t i = 0;
        if (!absl::StartsWith(key, prefix) || !absl::SimpleAtoi(key.substr(prefix.size()), &i) ||
            i >= sub_chunks[j].size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("sub-optimizer ", j, ": key '", key, "' is not '", prefix,
                           "<i>' with i below its ", sub_chunks[j].size(), " chunks"));
        }
        const size_t k = std::find(chain.begin(), chain.end(), sub_chunks[j][i]) - chain.begin();
        global = absl::StrCat(prefix, k);
      }
      absl::Status joined =
          Union(chunk, merged[global],
                absl::StrCat("chunk '", global, "' (from sub-optimizer ", j, " key '", key, "')"));
      if (!joined.ok()) return joined;
    }
  }
  return merged;
}

std::string ChunkKey(size_t k, size_t num_chunks, const std::string& prefix) {
  return num_chunks == 1 ? std::string("model") : absl::StrCat(prefix, k);
}

ChunkedStateDict SplitByModelChunk(const StateDict& flat, const std::vector<ParamInfo>& params,
                                   const std::vector<uint32_t>& chain_chunks,
                                   const std::string& prefix) {
  std::map<std::string, uint32_t> chunk_of;
  for (const ParamInfo& p : params) chunk_of[p.name] = p.model_chunk;
  auto key_of = [&](size_t k) { return ChunkKey(k, chain_chunks.size(), prefix); };
  ChunkedStateDict out;
  for (size_t k = 0; k < chain_chunks.size(); ++k) out[key_of(k)];
  for (const auto& [key, tensor] : flat) {
    const uint32_t* chunk = ChunkOfKey(key, chunk_of);
    for (size_t k = 0; k < chain_chunks.size(); ++k) {
      if (chunk == nullptr || *chunk == chain_chunks[k]) out[key_of(k)][key] = tensor;
    }
  }
  return out;
}

absl::StatusOr<StateDict> FlattenChunks(const ChunkedStateDict& chunked) {
  StateDict flat;
  for (const auto& [chunk_key, dict] : chunked) {
    absl::Status joined = Union(dict, flat, absl::StrCat("chunk '", chunk_key, "'"));
    if (!joined.ok()) return joined;
  }
  return flat;
}

}  // namespace optstep
