#ifndef OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_
#define OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_

// Streaming state dicts over gRPC in StateDictChunks: to a client (ExportStateDict), between
// ranks (held exports and imports), and assembling them on the receiving side.

#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "server/engine/session.h"

namespace optstep {

// One tensor to stream, with its place in a keyed layout (empty strings: merged).
struct StreamedTensor {
  std::string chunk_key;
  std::string sub_optimizer;
  std::string key;
  const StateTensor* tensor = nullptr;
};
struct StreamedState {
  std::shared_ptr<const void> keep;  // owns what the tensors point at
  std::vector<StreamedTensor> tensors;
};

// A server-streaming reactor that writes a state (in chunks of at most kMaxChunkBytes) once it
// is delivered, from any thread. Owns itself until done.
grpc::ServerWriteReactor<v1::StateDictChunk>* NewStateStreamReactor(
    std::function<void(std::function<void(absl::StatusOr<StreamedState>)> deliver)> produce);

// Collects streamed StateDictChunks into per-(sub-optimizer, chunk) dicts, checking every piece
// (dtype, shape, ranges, chunk size). Thread-compatible.
class StateDictAssembler {
 public:
  absl::Status Add(const v1::StateDictChunk& chunk);
  // The merged dict: a plain dict as sent; chunk-keyed parts flattened; per-sub-optimizer parts
  // merged (spec §7.2, with `session`'s chunk lists) and flattened. INVALID_ARGUMENT naming an
  // unknown sub-optimizer or the conflict.
  // Checks CheckComplete() first.
  absl::StatusOr<std::shared_ptr<const StateDict>> Build(const Session& session);
  // OK when every element of every tensor arrived exactly once; INVALID_ARGUMENT naming the key
  // and the element range that is missing or arrived twice.
  absl::Status CheckComplete() const;
  uint64_t tensors() const;
  uint64_t bytes() const { return bytes_; }

 private:
  using Where = std::pair<std::string, std::string>;  // (sub-optimizer, chunk key)
  std::map<Where, StateDict> parts_;
  // Element ranges [begin, end) received per (sub-optimizer, chunk key, key).
  std::map<std::tuple<std::string, std::string, std::string>,
           std::vector<std::pair<uint64_t, uint64_t>>>
      received_;
  uint64_t bytes_ = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_
