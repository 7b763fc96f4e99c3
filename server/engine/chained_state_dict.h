#ifndef OPTSTEP_SERVER_ENGINE_CHAINED_STATE_DICT_H_
#define OPTSTEP_SERVER_ENGINE_CHAINED_STATE_DICT_H_

// Chained optimizer state dicts keyed by model chunk (spec §7.2): splitting a model-chunk-keyed
// dict into one dict per sub-optimizer, re-indexed by each sub-optimizer's local chunk list, and
// merging such dicts back. Chunks are identified by the model_chunk ids parameters declare, never
// by position, so a sub-optimizer that spans every chunk (MoE experts next to dense layers) gets
// every chunk, and a dict with one chunk goes whole to every sub-optimizer. Pure functions.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "server/optim/param_info.h"
#include "server/optim/routing.h"

namespace optstep {

// Keys "model" (one chunk) or "<prefix><K>" with prefix "model" or "model_", K the chunk's
// global index; values: the state dict of that chunk.
using ChunkedStateDict = std::map<std::string, StateDict>;

// A chunk list per sub-optimizer (model_chunk ids; empty: the sub-optimizer has none).
using SubOptimizerChunks = std::vector<std::vector<uint32_t>>;

// "model" when `dict` has a "model0" key, else "model_" (spec §7.2).
std::string ChunkPrefix(const ChunkedStateDict& dict);

// Each sub-optimizer's chunk list: the distinct model_chunk ids of the parameters its groups
// hold, ascending.
SubOptimizerChunks ChunkListsOf(const std::vector<ParamInfo>& params,
                                const std::vector<ParamGroup>& groups, int num_sub_optimizers);

// The chained optimizer's chunk list: the ordered union of the sub-optimizers' lists with
// duplicates (same id) dropped; chunk K of a checkpoint is its K-th entry.
std::vector<uint32_t> ChainChunkList(const SubOptimizerChunks& sub_chunks);

// Spec §7.2: with exactly one chunk in the chain every sub-optimizer receives the whole dict;
// otherwise sub-optimizer j receives, for each local index i of its list, in[prefix + K]
// as out_j[prefix + i], K being the global index of its i-th chunk (by id). INVALID_ARGUMENT
// naming the key when one is missing.
absl::StatusOr<std::vector<ChunkedStateDict>> SplitChunkedStateDict(
    const ChunkedStateDict& dict, const SubOptimizerChunks& sub_chunks);
// The same split without copies: for each sub-optimizer, its keys and the chunk of `dict` each
// names (valid while `dict` is). A chain of many sub-optimizers exported in one chunk would
// otherwise hold a copy of the whole state per sub-optimizer.
using ChunkViews = std::vector<std::pair<std::string, const StateDict*>>;
absl::StatusOr<std::vector<ChunkViews>> SplitChunkedStateDictViews(
    const ChunkedStateDict& dict, const SubOptimizerChunks& sub_chunks);

// The inverse: every sub-optimizer's local keys re-indexed to global ones. A chunk that several
// sub-optimizers cover must carry identical tensors in each (INVALID_ARGUMENT naming the chunk
// and the key otherwise); INVALID_ARGUMENT for a key that is not "<prefix><i>" with i inside the
// sub-optimizer's list, or for a number of dicts other than the number of sub-optimizers.
absl::StatusOr<ChunkedStateDict> MergeChunkedStateDicts(const std::vector<ChunkedStateDict>& dicts,
                                                        const SubOptimizerChunks& sub_chunks);

// The key of the k-th of `num_chunks` chain chunks: "<prefix><k>", or "model" for one chunk.
std::string ChunkKey(size_t k, size_t num_chunks, const std::string& prefix = "model");

// A flat (merged) state dict by model chunk: chunk K holds "param/<name>" and
// "state/<sub>/<name>/<key>" of the parameters whose model_chunk is chain_chunks[K]; every
// other tensor (group step counters, "meta/...") goes into every chunk. Parameters are matched
// by exact name. One chunk: the key is "model".
ChunkedStateDict SplitByModelChunk(const StateDict& flat, const std::vector<ParamInfo>& params,
                                   const std::vector<uint32_t>& chain_chunks,
                                   const std::string& prefix = "model");

// Union of the chunks' dicts; a key found in several chunks must hold identical tensors
// (INVALID_ARGUMENT naming the key and both chunks).
absl::StatusOr<StateDict> FlattenChunks(const ChunkedStateDict& chunked);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_CHAINED_STATE_DICT_H_
