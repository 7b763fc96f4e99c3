#ifndef OPTSTEP_WIRE_CHUNK_H_
#define OPTSTEP_WIRE_CHUNK_H_

// The rules every tensor chunk on the wire obeys, in both directions: gradient chunks of the Step
// stream, InitParameters values, parameter chunks sent back and state-dict chunks. Stateless;
// thread-safe.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "optstep/v1/tensor.pb.h"

namespace optstep {

// Largest raw tensor payload of one chunk (the client's max_chunk_bytes may only lower it).
inline constexpr size_t kMaxChunkBytes = 4 << 20;

// Largest element offset a chunk may name: far above any tensor, and low enough that the offset
// plus the chunk's length in elements never overflows an int64.
inline constexpr uint64_t kMaxChunkOffset = uint64_t{1} << 62;

// The one extent rule: RESOURCE_EXHAUSTED when `bytes` exceeds kMaxChunkBytes, INVALID_ARGUMENT
// when `offset` exceeds kMaxChunkOffset. An offset out of range is refused, never clamped, so
// that the error names the offset the sender gave. `what` names the chunk in the error, e.g.
// "gradient chunk of param_id 3".
absl::Status CheckChunkExtent(uint64_t offset, size_t bytes, absl::string_view what);

// A parameter chunk's header, checked and converted to the engine's types.
struct ChunkHeader {
  int param_id = 0;  // an id above 2^30 is kept at 2^30, which names no parameter
  int64_t offset = 0;
  DType dtype = DType::kF32;
};

// CheckChunkExtent, then the dtype (fp32, bf16 or fp16; INVALID_ARGUMENT otherwise). The
// parameter id is left to the session, which answers NOT_FOUND for an id it does not hold.
absl::StatusOr<ChunkHeader> CheckChunkHeader(uint32_t param_id, uint64_t offset, v1::DType dtype,
                                             size_t bytes, absl::string_view what);

}  // namespace optstep

#endif  // OPTSTEP_WIRE_CHUNK_H_
