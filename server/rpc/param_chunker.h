#ifndef OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
#define OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "optstep/v1/tensor.pb.h"
#include "server/engine/param_snapshot.h"

namespace optstep {

// Cuts the parameters of a snapshot into chunks of at most `max_bytes` of payload, parameter by
// parameter: in the order asked for, or, for a snapshot still being filled (readiness set), in
// the order they become ready. Holds the snapshot alive. Thread-compatible.
class ParamChunker {
 public:
  // `param_ids` empty means every parameter. REQUIRES: ids are valid for the snapshot.
  ParamChunker(std::shared_ptr<const ParamSnapshot> snapshot, std::vector<uint32_t> param_ids,
               size_t max_bytes);

  // OK while the snapshot may be read on; RESOURCE_EXHAUSTED once its session let it go, having
  // stepped on with no room to hold it longer (SnapshotRetention). NextStepResponse checks it.
  absl::Status CheckHeld() const;
  // Number of chunks Next will produce in all.
  uint64_t num_chunks() const { return num_chunks_; }
  // Fills the next chunk (a copy of its bytes); false when done.
  // REQUIRES: the snapshot is complete (every parameter marked ready, if it was streamed).
  bool Next(v1::TensorChunk* chunk);

  enum class Progress { kChunk, kWaiting, kDone };
  // The next chunk as a serialised StepResponse{parameter} whose payload is a slice of the
  // snapshot itself (no copy; the slice keeps the snapshot alive), so every trainer is sent the
  // same bytes; `*payload_bytes`: its raw tensor bytes. kWaiting: no parameter is ready yet, or
  // every one went out and the step has not ended on this rank yet (ParamReadiness::End); `wake`
  // is called when that may change (it may also be called when it did not: call again). The
  // step's error when it failed while the snapshot was being filled, or after.
  absl::StatusOr<Progress> NextStepResponse(grpc::ByteBuffer* message, size_t* payload_bytes,
                                            std::function<void()> wake);

 private:
  struct Range {
    uint32_t param_id;
    size_t byte_offset;
    size_t bytes;
  };
  // The next range and advances; false when done.
  bool NextRange(Range& range);

  // Appends the asked-for parameters that became ready to ids_; false when none did.
  absl::StatusOr<bool> Refill(std::function<void()> wake);

  std::shared_ptr<const ParamSnapshot> snapshot_;
  std::vector<uint32_t> ids_;  // in sending order (so far, for a snapshot being filled)
  std::vector<bool> wanted_;   // by param id
  size_t expected_ = 0;        // number of parameters to send
  size_t ready_seen_ = 0;      // into the snapshot's readiness order
  size_t max_bytes_;
  uint64_t num_chunks_ = 0;
  size_t index_ = 0;        // into ids_
  size_t byte_offset_ = 0;  // within the current parameter
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_PARAM_CHUNKER_H_
