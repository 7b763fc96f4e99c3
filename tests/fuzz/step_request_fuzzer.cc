// Fuzz target for the Step stream's hand-written codec (wire/raw_step_codec.h), which reads
// bytes straight from the network. The first input byte picks what is fuzzed:
// - high bit clear: DecodeStepRequest on the rest, cut into slices of (byte & 0x7f) bytes (0: one
//   slice), as the network may deliver it. Besides "no crash, no sanitizer report": every error
//   is INVALID_ARGUMENT, and a message the codec accepts is one protobuf parses to the same
//   StepRequest (kind, header, commit, gradient fields and data).
// - high bit set: EncodeParameterChunk of {param_id, offset, dtype} read from the next 16 bytes
//   and a payload of the rest. The result is protobuf's own serialisation of that StepResponse,
//   the payload is referred to, not copied, and released exactly once.

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "wire/raw_step_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace optstep {
namespace {

const bool kQuietProtobuf = fuzz::QuietProtobuf();

using fuzz::Check;

// `wire` as a ByteBuffer of slices of `slice_bytes` each (the last one shorter); 0: one slice.
grpc::ByteBuffer Buffer(absl::string_view wire, size_t slice_bytes) {
  if (slice_bytes == 0) slice_bytes = wire.size() + 1;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += slice_bytes) {
    slices.emplace_back(wire.data() + at, std::min(slice_bytes, wire.size() - at));
  }
  if (slices.empty()) slices.emplace_back();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const std::vector<grpc::Slice>& slices) {
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

void FuzzDecode(absl::string_view wire, size_t slice_bytes) {
  grpc::ByteBuffer buffer = Buffer(wire, slice_bytes);
  StepRequestView view;
  const absl::Status status = DecodeStepRequest(buffer, view);
  if (!status.ok()) {
    Check(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty());
    return;
  }
  v1::StepRequest expected;
  Check(expected.ParseFromArray(wire.data(), static_cast<int>(wire.size())));
  Check(view.kind == expected.kind_case());
  switch (view.kind) {
    case v1::StepRequest::kHeader:
      Check(view.header.SerializeAsString() == expected.header().SerializeAsString());
      break;
    case v1::StepRequest::kCommit:
      Check(view.commit.SerializeAsString() == expected.commit().SerializeAsString());
      break;
    case v1::StepRequest::kGradient: {
      const v1::TensorChunk& chunk = expected.gradient();
      Check(view.gradient.param_id == chunk.param_id());
      Check(view.gradient.offset == chunk.offset());
      Check(view.gradient.dtype == static_cast<int>(chunk.dtype()));
      std::string data;
      for (absl::string_view piece : view.gradient.data) data.append(piece.data(), piece.size());
      Check(view.gradient.data_bytes == data.size() && data == chunk.data());
      break;
    }
    case v1::StepRequest::KIND_NOT_SET:
      break;
  }
}

// Reads sizeof(T) bytes from the front of `in` (zeros past its end) and consumes them.
template <typename T>
T Take(absl::string_view& in) {
  unsigned char bytes[sizeof(T)] = {};
  const size_t n = std::min(sizeof(T), in.size());
  std::memcpy(bytes, in.data(), n);
  in.remove_prefix(n);
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

void FuzzEncode(absl::string_view in) {
  const uint32_t param_id = Take<uint32_t>(in);
  const uint64_t offset = Take<uint64_t>(in);
  const int dtype = Take<int32_t>(in);
  const std::string payload(in);  // the caller's bytes, alive until released
  int released = 0;
  {
    grpc::ByteBuffer message = EncodeParameterChunk(
        param_id, offset, dtype, payload, [](void* arg) { ++*static_cast<int*>(arg); }, &released);
    std::vector<grpc::Slice> slices;
    Check(message.Dump(&slices).ok());
    v1::StepResponse response;
    v1::TensorChunk* chunk = response.mutable_parameter();
    chunk->set_param_id(param_id);
    chunk->set_offset(offset);
    chunk->set_dtype(static_cast<v1::DType>(dtype));
    chunk->set_data(payload);
    Check(Joined(slices) == response.SerializeAsString());
    if (!payload.empty()) {
      Check(slices.size() == 2 &&
            reinterpret_cast<const char*>(slices[1].begin()) == payload.data());
    }
    Check(released == 0);
  }
  Check(released == 1);
}

}  // namespace
}  // namespace optstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 0x80) {
    optstep::FuzzEncode(rest);
  } else {
    optstep::FuzzDecode(rest, data[0] & 0x7f);
  }
  return 0;
}
