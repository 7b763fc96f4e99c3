#ifndef OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
#define OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "optstep/v1/tensor.pb.h"
#include "server/engine/param_snapshot.h"

namespace optstep {

// Cuts the parameters of a snapshot into TensorChunk messages of at most `max_bytes` of payload,
// parameter by parameter in the order asked for. Holds the snapshot alive. Thread-compatible.
class ParamChunker {
 public:
  // `param_ids` empty means every parameter. REQUIRES: ids are valid for the snapshot.
  ParamChunker(std::shared_ptr<const ParamSnapshot> snapshot, std::vector<uint32_t> param_ids,
               size_t max_bytes);

  // Number of chunks Next will produce in all.
  uint64_t num_chunks() const { return num_chunks_; }
  // Fills the next chunk; false when done.
  bool Next(v1::TensorChunk* chunk);

 private:
  std::shared_ptr<const ParamSnapshot> snapshot_;
  std::vector<uint32_t> ids_;
  size_t max_bytes_;
  uint64_t num_chunks_ = 0;
  size_t index_ = 0;   // into ids_
  size_t byte_offset_ = 0;  // within the current parameter
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
