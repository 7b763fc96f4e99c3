#ifndef OPTSTEP_WIRE_STREAM_END_H_
#define OPTSTEP_WIRE_STREAM_END_H_

// The final message of a client stream of tensor chunks (v1::StreamEnd: InitParameters,
// ImportStateDict, a rank's staged import): the sender tallies what it sends and ends with the
// tally; the receiver tallies what it received and applies the stream only when both agree.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "optstep/v1/tensor.pb.h"

namespace optstep {

// Counts the chunk messages and payload bytes of one stream and their CRC-32 (zlib's), in the
// order they were sent or received. Thread-compatible.
class StreamTally {
 public:
  // One chunk message with payload `data` (which may be empty).
  void Add(absl::string_view data);

  // The final message the sender sends: the tally, with `tensors` distinct tensors.
  v1::StreamEnd End(uint64_t tensors) const;

  // OK when `end` agrees with this tally and `tensors`; INVALID_ARGUMENT naming `what`, what the
  // final message declares and what arrived otherwise.
  absl::Status Check(const v1::StreamEnd& end, uint64_t tensors, absl::string_view what) const;

  // "3 tensors (7 chunks, 1234 bytes)": what arrived, for error messages.
  std::string Describe(uint64_t tensors) const;

  uint64_t chunks() const { return chunks_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
  uint32_t crc32_ = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_WIRE_STREAM_END_H_
