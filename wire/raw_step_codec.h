#ifndef OPTSTEP_WIRE_RAW_STEP_CODEC_H_
#define OPTSTEP_WIRE_RAW_STEP_CODEC_H_

// The Step stream's wire format handled by hand on the raw grpc::ByteBuffer, so that tensor
// bytes are never copied into (or out of) a protobuf `bytes` string (docs/design.md §4):
// - DecodeStepRequest (the server) parses a StepRequest; the small kinds (header, commit) go
//   through protobuf, a gradient chunk's `data` is answered as views of the buffer's slices,
//   ready to be copied once into the gradient buffer.
// - EncodeParameterChunk (the server) builds a StepResponse{parameter} from a small header slice
//   and a slice that refers to the caller's bytes, so the same serialised parameters go to every
//   trainer.
// - DecodeStepResponse (the clients) parses a StepResponse the same way: a parameter chunk's
//   `data` as views of the received slices, copied once into the caller's tensor.
// The wire format is exactly StepRequest / StepResponse of optimizer_service.proto. (The
// client's gradient chunks are encoded by client/cpp/gradient_wire.h.)

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "optstep/v1/optimizer_service.pb.h"

namespace optstep {

// A TensorChunk whose `data` stays in the received slices.
struct TensorChunkView {
  uint32_t param_id = 0;
  uint64_t offset = 0;
  int dtype = 0;  // the v1::DType number as sent (proto3 enums are open)
  // `data`, in order, as views of the ByteBuffer's slices (valid while that buffer lives).
  std::vector<absl::string_view> data;
  size_t data_bytes = 0;  // sum of data[i].size()
};

// One decoded StepRequest; only the member named by `kind` is meaningful.
struct StepRequestView {
  v1::StepRequest::KindCase kind = v1::StepRequest::KIND_NOT_SET;
  v1::StepHeader header;
  v1::StepCommit commit;
  TensorChunkView gradient;
};

// One decoded StepResponse; only the member named by `kind` is meaningful.
struct StepResponseView {
  v1::StepResponse::KindCase kind = v1::StepResponse::KIND_NOT_SET;
  v1::StepResult result;
  TensorChunkView parameter;
};

// Decodes `buffer` as a StepRequest with protobuf's semantics for well-formed input (the last
// `kind` wins, a repeated sub-message merges, unknown fields are skipped). INVALID_ARGUMENT,
// naming the field, for malformed input: a truncated varint or tag, a known field with a wrong
// wire type, a length past the end of its message, an unparsable header or commit.
// `buffer` is only read; it is non-const because gRPC's reader takes it so.
absl::Status DecodeStepRequest(grpc::ByteBuffer& buffer, StepRequestView& out);
// The same for a StepResponse ("malformed StepResponse"; a StepResult that does not parse).
absl::Status DecodeStepResponse(grpc::ByteBuffer& buffer, StepResponseView& out);

// The wire bytes of a StepResponse whose `parameter` is TensorChunk{param_id, offset, dtype,
// data}: the bytes before `data`'s payload. Fields at their default value are omitted, as
// protobuf does, so header + payload equals protobuf's own serialisation.
std::string EncodeParameterChunkHeader(uint32_t param_id, uint64_t offset, int dtype,
                                       size_t data_bytes);

// A StepResponse{parameter} as two slices: the header above (copied, a few bytes) and `payload`
// (not copied). REQUIRES: `payload` stays valid until gRPC releases the slice: `release(arg)` is
// called once it has (possibly on another thread, possibly after the call ended).
grpc::ByteBuffer EncodeParameterChunk(uint32_t param_id, uint64_t offset, int dtype,
                                      absl::string_view payload, void (*release)(void*), void* arg);

}  // namespace optstep

#endif  // OPTSTEP_WIRE_RAW_STEP_CODEC_H_
