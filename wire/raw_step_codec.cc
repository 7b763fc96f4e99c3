#include "wire/raw_step_codec.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

// What is wrong with a message; the public functions name the message (Named).
absl::Status Malformed(absl::string_view what) { return absl::InvalidArgumentError(what); }

// `status` (from Malformed) as "step stream: malformed <message>: <what>".
absl::Status Named(const absl::Status& status, absl::string_view message) {
  if (!absl::IsInvalidArgument(status)) return status;
  return absl::Status(status.code(),
                      absl::StrCat("step stream: malformed ", message, ": ", status.message()));
}

// Reads one tag inside the current limit: false at the limit (the message ended), an error for
// a truncated or zero field number, or a tag that protobuf refuses: longer than 5 bytes or over
// 32 bits (CodedInputStream::ReadTag would truncate it to a valid-looking tag).
absl::StatusOr<bool> NextTag(CodedInputStream& in, absl::string_view message, uint32_t& tag) {
  if (in.BytesUntilLimit() == 0) return false;
  const int start = in.CurrentPosition();
  uint64_t value = 0;
  const bool read = in.ReadVarint64(&value);
  tag = (read && in.CurrentPosition() - start <= 5 && value <= UINT32_MAX)
            ? static_cast<uint32_t>(value)
            : 0;
  if (tag == 0 || WireFormatLite::GetTagFieldNumber(tag) == 0) {
    return Malformed(absl::StrCat(message, ": truncated or invalid tag with ", in.BytesUntilLimit(),
                                  " bytes left"));
  }
  return true;
}

absl::Status ExpectWireType(uint32_t tag, WireFormatLite::WireType expected,
                            absl::string_view field) {
  const WireFormatLite::WireType got = WireFormatLite::GetTagWireType(tag);
  if (got == expected) return absl::OkStatus();
  return Malformed(absl::StrCat(field, " has wire type ", static_cast<int>(got), ", expected ",
                                static_cast<int>(expected)));
}

absl::Status ReadVarint(CodedInputStream& in, absl::string_view field, uint64_t& value) {
  if (!in.ReadVarint64(&value)) return Malformed(absl::StrCat(field, ": truncated varint"));
  return absl::OkStatus();
}

// Reads the length of a length-delimited field (after its tag) and checks that it ends inside
// the enclosing message.
absl::StatusOr<int> ReadLength(CodedInputStream& in, uint32_t tag, absl::string_view field) {
  OPTSTEP_RETURN_IF_ERROR(ExpectWireType(tag, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, field));
  uint64_t length = 0;
  OPTSTEP_RETURN_IF_ERROR(ReadVarint(in, absl::StrCat(field, " length"), length));
  if (length > static_cast<uint64_t>(in.BytesUntilLimit())) {
    return Malformed(absl::StrCat(field, ": length ", length, " runs past the end (",
                                  in.BytesUntilLimit(), " bytes left)"));
  }
  return static_cast<int>(length);
}

// Skips an unknown field as protobuf's parser does: a length or a group must end inside the
// enclosing message, a length is read whole (CodedInputStream::SkipField would truncate it to 32
// bits), groups nest at most 64 deep (within protobuf's recursion limit of 100).
absl::Status SkipUnknown(CodedInputStream& in, uint32_t tag, absl::string_view message,
                         int depth = 0) {
  const int field = WireFormatLite::GetTagFieldNumber(tag);
  const std::string what = absl::StrCat(message, ": field ", field);
  uint64_t value = 0;
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_VARINT:
      return ReadVarint(in, what, value);
    case WireFormatLite::WIRETYPE_FIXED64:
    case WireFormatLite::WIRETYPE_FIXED32: {
      const int size =
          WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_FIXED64 ? 8 : 4;
      if (in.BytesUntilLimit() < size || !in.Skip(size)) return Malformed(what + ": truncated");
      return absl::OkStatus();
    }
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      OPTSTEP_ASSIGN_OR_RETURN(const int length, ReadLength(in, tag, what));
      if (!in.Skip(length)) return Malformed(what + ": truncated");
      return absl::OkStatus();
    }
    case WireFormatLite::WIRETYPE_START_GROUP: {
      if (depth >= 64) return Malformed(what + ": groups nest too deep");
      uint32_t inner = 0;
      while (true) {
        OPTSTEP_ASSIGN_OR_RETURN(const bool more, NextTag(in, what, inner));
        if (!more) return Malformed(what + ": group does not end");
        if (WireFormatLite::GetTagWireType(inner) == WireFormatLite::WIRETYPE_END_GROUP &&
            WireFormatLite::GetTagFieldNumber(inner) == field) {
          return absl::OkStatus();
        }
        OPTSTEP_RETURN_IF_ERROR(SkipUnknown(in, inner, what, depth + 1));
      }
    }
    default:
      return Malformed(absl::StrCat(what, " with wire type ",
                                    static_cast<int>(WireFormatLite::GetTagWireType(tag)),
                                    " cannot be skipped"));
  }
}

// Merges a small sub-message (header, commit) through protobuf.
template <typename Message>
absl::Status MergeMessage(CodedInputStream& in, uint32_t tag, absl::string_view field,
                          Message& message) {
  OPTSTEP_ASSIGN_OR_RETURN(const int length, ReadLength(in, tag, field));
  std::string bytes;
  if (!in.ReadString(&bytes, length) || !message.MergeFromString(bytes)) {
    return Malformed(absl::StrCat(field, " does not parse as ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

// The fields of a TensorChunk, merged into `chunk` (inside a limit set to its length).
// `field` names it in errors.
absl::Status MergeTensorChunk(CodedInputStream& in, absl::string_view field,
                              TensorChunkView& chunk) {
  uint32_t tag = 0;
  while (true) {
    OPTSTEP_ASSIGN_OR_RETURN(const bool more, NextTag(in, field, tag));
    if (!more) return absl::OkStatus();
    uint64_t value = 0;
    switch (WireFormatLite::GetTagFieldNumber(tag)) {
      case 1:
        OPTSTEP_RETURN_IF_ERROR(ExpectWireType(tag, WireFormatLite::WIRETYPE_VARINT, "param_id"));
        OPTSTEP_RETURN_IF_ERROR(ReadVarint(in, "param_id", value));
        chunk.param_id = static_cast<uint32_t>(value);  // as protobuf truncates a uint32
        break;
      case 2:
        OPTSTEP_RETURN_IF_ERROR(ExpectWireType(tag, WireFormatLite::WIRETYPE_VARINT, "offset"));
        OPTSTEP_RETURN_IF_ERROR(ReadVarint(in, "offset", chunk.offset));
        break;
      case 3:
        OPTSTEP_RETURN_IF_ERROR(ExpectWireType(tag, WireFormatLite::WIRETYPE_VARINT, "dtype"));
        OPTSTEP_RETURN_IF_ERROR(ReadVarint(in, "dtype", value));
        chunk.dtype = static_cast<int32_t>(value);  // as protobuf reads an enum
        break;
      case 4: {
        OPTSTEP_ASSIGN_OR_RETURN(int length, ReadLength(in, tag, "data"));
        chunk.data.clear();
        chunk.data_bytes = static_cast<size_t>(length);
        while (length > 0) {
          const void* piece = nullptr;
          int size = 0;
          if (!in.GetDirectBufferPointer(&piece, &size)) return Malformed("data: truncated");
          const int n = std::min(length, size);
          chunk.data.emplace_back(static_cast<const char*>(piece), n);
          in.Skip(n);
          length -= n;
        }
        break;
      }
      default:
        OPTSTEP_RETURN_IF_ERROR(SkipUnknown(in, tag, field));
    }
  }
}

// A TensorChunk field (after its tag), merged into `chunk`.
absl::Status MergeChunkField(CodedInputStream& in, uint32_t tag, absl::string_view field,
                             TensorChunkView& chunk) {
  OPTSTEP_ASSIGN_OR_RETURN(const int length, ReadLength(in, tag, field));
  const CodedInputStream::Limit limit = in.PushLimit(length);
  OPTSTEP_RETURN_IF_ERROR(MergeTensorChunk(in, field, chunk));
  in.PopLimit(limit);
  return absl::OkStatus();
}

// Reads the fields of the message in `buffer` in order: `read_field(in, tag)` reads the field
// after its tag and answers true, or answers false for a field it does not know, which is
// skipped as protobuf skips it. `message` names it in errors.
absl::Status ReadFields(
    grpc::ByteBuffer& buffer, absl::string_view message,
    absl::FunctionRef<absl::StatusOr<bool>(CodedInputStream& in, uint32_t tag)> read_field) {
  const size_t total = buffer.Length();
  if (total > static_cast<size_t>(INT32_MAX)) {
    return Malformed(absl::StrCat(total, " bytes is over the 2 GiB message limit"));
  }
  grpc::ProtoBufferReader reader(&buffer);
  if (!reader.status().ok()) return absl::InternalError("step stream: unreadable message buffer");
  CodedInputStream in(&reader);
  in.PushLimit(static_cast<int>(total));
  uint32_t tag = 0;
  while (true) {
    OPTSTEP_ASSIGN_OR_RETURN(const bool more, NextTag(in, message, tag));
    if (!more) return absl::OkStatus();
    OPTSTEP_ASSIGN_OR_RETURN(const bool known, read_field(in, tag));
    if (!known) OPTSTEP_RETURN_IF_ERROR(SkipUnknown(in, tag, message));
  }
}

// One field of a StepRequest (after its tag) into `out`; false for an unknown field. A oneof
// member replaces another kind, and merges into itself when repeated.
absl::StatusOr<bool> ReadRequestField(CodedInputStream& in, uint32_t tag, StepRequestView& out) {
  const int field = WireFormatLite::GetTagFieldNumber(tag);
  if (field < 1 || field > 3) return false;
  const auto kind = static_cast<v1::StepRequest::KindCase>(field);
  if (out.kind != kind) {
    out.header.Clear();
    out.commit.Clear();
    out.gradient = TensorChunkView();
  }
  if (field == 1) {
    OPTSTEP_RETURN_IF_ERROR(MergeMessage(in, tag, "header (field 1)", out.header));
  } else if (field == 2) {
    OPTSTEP_RETURN_IF_ERROR(MergeChunkField(in, tag, "gradient (field 2)", out.gradient));
  } else {
    OPTSTEP_RETURN_IF_ERROR(MergeMessage(in, tag, "commit (field 3)", out.commit));
  }
  out.kind = kind;
  return true;
}

// The same for a StepResponse.
absl::StatusOr<bool> ReadResponseField(CodedInputStream& in, uint32_t tag, StepResponseView& out) {
  const int field = WireFormatLite::GetTagFieldNumber(tag);
  if (field < 1 || field > 2) return false;
  const auto kind = static_cast<v1::StepResponse::KindCase>(field);
  if (out.kind != kind) {
    out.result.Clear();
    out.parameter = TensorChunkView();
  }
  if (field == 1) {
    OPTSTEP_RETURN_IF_ERROR(MergeMessage(in, tag, "result (field 1)", out.result));
  } else {
    OPTSTEP_RETURN_IF_ERROR(MergeChunkField(in, tag, "parameter (field 2)", out.parameter));
  }
  out.kind = kind;
  return true;
}

}  // namespace

absl::Status DecodeStepRequest(grpc::ByteBuffer& buffer, StepRequestView& out) {
  out.kind = v1::StepRequest::KIND_NOT_SET;
  auto read = [&out](CodedInputStream& in, uint32_t tag) { return ReadRequestField(in, tag, out); };
  return Named(ReadFields(buffer, "StepRequest", read), "StepRequest");
}

absl::Status DecodeStepResponse(grpc::ByteBuffer& buffer, StepResponseView& out) {
  out.kind = v1::StepResponse::KIND_NOT_SET;
  auto read = [&out](CodedInputStream& in, uint32_t tag) {
    return ReadResponseField(in, tag, out);
  };
  return Named(ReadFields(buffer, "StepResponse", read), "StepResponse");
}

std::string EncodeParameterChunkHeader(uint32_t param_id, uint64_t offset, int dtype,
                                       size_t data_bytes) {
  std::string chunk;  // the TensorChunk's fields before data's payload
  {
    google::protobuf::io::StringOutputStream stream(&chunk);
    CodedOutputStream out(&stream);
    if (param_id != 0) WireFormatLite::WriteUInt32(1, param_id, &out);
    if (offset != 0) WireFormatLite::WriteUInt64(2, offset, &out);
    if (dtype != 0) WireFormatLite::WriteEnum(3, dtype, &out);
    if (data_bytes != 0) {
      WireFormatLite::WriteTag(4, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &out);
      out.WriteVarint64(data_bytes);
    }
  }
  std::string header;  // StepResponse.parameter (field 2) around it
  {
    google::protobuf::io::StringOutputStream stream(&header);
    CodedOutputStream out(&stream);
    WireFormatLite::WriteTag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, &out);
    out.WriteVarint64(chunk.size() + data_bytes);
    out.WriteRaw(chunk.data(), static_cast<int>(chunk.size()));
  }
  return header;
}

grpc::ByteBuffer EncodeParameterChunk(uint32_t param_id, uint64_t offset, int dtype,
                                      absl::string_view payload, void (*release)(void*),
                                      void* arg) {
  grpc::Slice slices[2] = {
      grpc::Slice(EncodeParameterChunkHeader(param_id, offset, dtype, payload.size())),
      grpc::Slice(const_cast<char*>(payload.data()), payload.size(), release, arg)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace optstep
