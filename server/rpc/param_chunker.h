#ifndef OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
#define OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "optstep/v1/tensor.pb.h"
#include "server/engine/param_snapshot.h"

namespace optstep {

// Cuts the parameters of a snapshot into chunks of at most `max_bytes` of payload, parameter by
// parameter in the order asked for. Holds the snapshot alive. Thread-compatible.
class ParamChunker {
 public:
  // `param_ids` empty means every parameter. REQUIRES: ids are valid for the snapshot.
  ParamChunker(std::shared_ptr<const ParamSnapshot> snapshot, std::vector<uint32_t> param_ids,
               size_t max_bytes);

  // Number of chunks Next will produce in all.
  uint64_t num_chunks() const { return num_chunks_; }
  // Fills the next chunk (a copy of its bytes); false when done.
  bool Next(v1::TensorChunk* chunk);
  // The next chunk as a serialised StepResponse{parameter} whose payload is a slice of the
  // snapshot itself (no copy; the slice keeps the snapshot alive), so every trainer is sent the
  // same bytes. `*payload_bytes`: the chunk's raw tensor bytes. False when done.
  bool NextStepResponse(grpc::ByteBuffer* message, size_t* payload_bytes);

 private:
  struct Range {
    uint32_t param_id;
    size_t byte_offset;
    size_t bytes;
  };
  // The next range and advances; false when done.
  bool NextRange(Range& range);

  std::shared_ptr<const ParamSnapshot> snapshot_;
  std::vector<uint32_t> ids_;
  size_t max_bytes_;
  uint64_t num_chunks_ = 0;
  size_t index_ = 0;   // into ids_
  size_t byte_offset_ = 0;  // within the current parameter
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
