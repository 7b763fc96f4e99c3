#ifndef OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_
#define OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_

// Streaming state dicts over gRPC in StateDictChunks: to a client (ExportStateDict), between
// ranks (held exports and imports), and assembling them on the receiving side (ImportStateDict,
// a rank's part of a held import).

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "server/engine/engine.h"
#include "server/engine/session.h"
#include "server/rpc/caller.h"
#include "server/rpc/idle_bound.h"
#include "server/rpc/open_streams.h"
#include "server/rpc/stall_watch.h"

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

// Fills `chunk` with the piece of `item` that starts at byte `offset`: whole elements, at most
// kMaxChunkBytes (wire/chunk.h). Returns the byte offset of the next piece; the tensor's size
// after its last piece. A tensor of no bytes is one empty piece.
size_t FillStateChunk(const StreamedTensor& item, size_t offset, v1::StateDictChunk* chunk);
// Every piece of `item` in order, each filled into `chunk` and then sent with `send`. Stops at
// the first `send` that returns false, and returns false then.
bool ForEachStateChunk(const StreamedTensor& item, v1::StateDictChunk* chunk,
                       const std::function<bool()>& send);

// A server-streaming reactor that writes a state (FillStateChunk's pieces) once it is delivered,
// from any thread, to the caller of `context` (null with no bound), within the stream idle bound
// `idle_timeout` (OwnedWriteReactor; `what` names the stream). Owns itself until done. `produce`
// is given `deliver`, to call once with the state or why there is none, and `ended`, true once
// the stream ended (cancelled) and nothing delivered would be sent.
grpc::ServerWriteReactor<v1::StateDictChunk>* NewStateStreamReactor(
    grpc::CallbackServerContext* context, absl::Duration idle_timeout, const char* what,
    std::function<void(std::function<void(absl::StatusOr<StreamedState>)> deliver,
                       std::function<bool()> ended)>
        produce);

// What an upload does with the dict it received: `session` is the one its first message named,
// `token` that message's hold (0 for a client's ImportStateDict), `bytes` the payload received.
using StateDictUpload = std::function<absl::Status(
    Session& session, uint64_t token, std::shared_ptr<const StateDict> dict, uint64_t bytes)>;

// A client-streaming reactor for a state dict sent in pieces: v1::StateDictChunk (a client's
// ImportStateDict) or v1::HeldStateChunk (a rank's part of a held import). The first message
// names the session; every piece goes through a StateDictAssembler (bounded by what a state dict
// of the session can hold: RESOURCE_EXHAUSTED). The stream is a transaction: its last message is
// a v1::StreamEnd (wire/stream_end.h), and only when that arrived, agreed and the stream then
// half-closed does the reactor build the dict and run `action` on it, on a thread of its own (the
// action may block on other ranks; with `open`, a caller's upload, in its caller's turn among
// its calls: ProcessCallerCalls), finishing the call with the status. Otherwise the action
// never runs: INVALID_ARGUMENT for a stream without its StreamEnd, a StreamEnd that disagrees
// or a message after it, CANCELLED for a cancelled stream (DEADLINE_EXCEEDED when `idle`, the
// watch of its call, cancelled it). A stream without messages is INVALID_ARGUMENT
// `empty_error`. Only a session `caller` may see is found. With `open` (may be null: no bound), a
// session has at most two such streams open on this rank, or one per trainer when it has more
// (each holds up to a copy of the session's state until its action ends): another is
// RESOURCE_EXHAUSTED, and the tensors it declares are held as the session owner's (StagingCharge:
// a place of the owner's in the headroom, else its budget; RESOURCE_EXHAUSTED when neither
// holds them). With `caller_key` (CallerKey; empty: no bound), a stream that has sent no
// message yet holds a place of its caller's in SilentUploads (none left: RESOURCE_EXHAUSTED).
// Owns itself until done.
template <typename Message>
grpc::ServerReadReactor<Message>* NewStateDictUploadReactor(
    Engine* engine, Caller caller, const std::string& caller_key, std::string empty_error,
    std::shared_ptr<CallIdleWatch> idle, OpenStreams* open, StateDictUpload action);

// Collects streamed StateDictChunks into per-(sub-optimizer, chunk) dicts, checking every piece
// (dtype, shape, ranges, chunk size, a key's length, data in every chunk, no more data than the
// tensors declare, no more ranges apart than kSmallChunkBytes's bound). Thread-compatible.
class StateDictAssembler {
 public:
  // The longest key, chunk key or sub-optimizer name a chunk may carry (a parameter's name has
  // at most 1024 bytes, a sub-optimizer's 255).
  static constexpr size_t kMaxStateKeyBytes = 4096;
  // Ranges of elements a stream may send apart (a chunk that continues its tensor's last one
  // extends it): one per tensor and per kSmallChunkBytes the tensors declare, and kSpareChunks
  // more; beyond, RESOURCE_EXHAUSTED.
  static constexpr uint64_t kSmallChunkBytes = uint64_t{64} << 10;
  static constexpr uint64_t kSpareChunks = 1024;

  // The most bytes the tensors may declare together (their shapes, before their data arrives):
  // a tensor over it is RESOURCE_EXHAUSTED. No limit by default.
  void set_byte_limit(uint64_t limit) { byte_limit_ = limit; }
  // Asked with a new tensor's bytes before they are allocated (what it will hold once its data
  // arrived); its error refuses the chunk. None by default.
  using Reserve = std::function<absl::Status(uint64_t bytes)>;
  void set_reserve(Reserve reserve) { reserve_ = std::move(reserve); }
  absl::Status Add(const v1::StateDictChunk& chunk);
  // Reads a client stream of chunks to its end, adding each one (and marking it on `watch`, when
  // given): the stream's end turned into a status by `finished` when it is not OK, else the
  // first chunk refused, else OK.
  absl::Status AddAll(grpc::ClientReaderInterface<v1::StateDictChunk>& reader,
                      const std::function<absl::Status(const grpc::Status&)>& finished,
                      StallWatch* watch = nullptr);
  // The merged dict: a plain dict as sent; chunk-keyed parts flattened; per-sub-optimizer parts
  // merged (spec §7.2, with `session`'s chunk lists) and flattened. INVALID_ARGUMENT naming an
  // unknown sub-optimizer or the conflict.
  // Checks CheckComplete() first.
  absl::StatusOr<std::shared_ptr<const StateDict>> Build(const Session& session);
  // The dict as sent, when no key came keyed by model chunk or sub-optimizer (a rank's own
  // exports); INVALID_ARGUMENT otherwise. Checks CheckComplete() first.
  absl::StatusOr<std::shared_ptr<const StateDict>> BuildPlain();
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
  uint64_t declared_bytes_ = 0;  // <= byte_limit_
  uint64_t byte_limit_ = UINT64_MAX;
  Reserve reserve_;
  uint64_t ranges_ = 0;  // in received_
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STATE_DICT_STREAM_H_
