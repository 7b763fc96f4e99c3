#include "client/cpp/gradient_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include "optstep/v1/tensor.pb.h"
#include "wire/proto_dtype.h"

namespace optstep {
namespace client_internal {

using google::protobuf::internal::WireFormatLite;

std::string GradientChunkHeader(const GradientSlice& chunk) {
  constexpr int kGradientField = 2;  // StepRequest.gradient
  constexpr int kDataField = 4;      // TensorChunk.data
  // Fields 1-3 as protobuf writes them (defaults omitted), then data's tag and length.
  v1::TensorChunk fields;
  fields.set_param_id(chunk.param_id);
  fields.set_offset(chunk.offset);
  fields.set_dtype(DTypeToProto(chunk.dtype));
  std::string tensor_chunk = fields.SerializeAsString();
  const size_t payload = chunk.bytes.size();
  if (payload > 0) {
    google::protobuf::io::StringOutputStream stream(&tensor_chunk);
    google::protobuf::io::CodedOutputStream out(&stream);
    WireFormatLite::WriteTag(kDataField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &out);
    out.WriteVarint64(payload);
  }
  std::string header;
  {
    google::protobuf::io::StringOutputStream stream(&header);
    google::protobuf::io::CodedOutputStream out(&stream);
    WireFormatLite::WriteTag(kGradientField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &out);
    out.WriteVarint64(tensor_chunk.size() + payload);
    out.WriteString(tensor_chunk);
  }
  return header;
}

grpc::ByteBuffer GradientChunkMessage(const GradientSlice& chunk, void (*release)(void*),
                                      void* arg) {
  grpc::Slice slices[2] = {
      grpc::Slice(GradientChunkHeader(chunk)),
      grpc::Slice(const_cast<uint8_t*>(chunk.bytes.data()), chunk.bytes.size(), release, arg)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace client_internal
}  // namespace optstep
