#include "wire/raw_step_codec.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// `wire` as a ByteBuffer cut into slices of `slice_bytes` (the last one shorter), as the network
// may deliver it.
grpc::ByteBuffer Buffer(const std::string& wire, size_t slice_bytes) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += slice_bytes) {
    slices.emplace_back(wire.data() + at, std::min(slice_bytes, wire.size() - at));
  }
  if (slices.empty()) slices.emplace_back();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The views in `view` point into the returned buffer's slices.
struct Decoded {
  grpc::ByteBuffer buffer;
  absl::Status status;
};
Decoded Decode(const std::string& wire, StepRequestView& view, size_t slice_bytes = 1 << 20) {
  Decoded decoded{Buffer(wire, slice_bytes), absl::OkStatus()};
  decoded.status = DecodeStepRequest(decoded.buffer, view);
  return decoded;
}

std::string Joined(const TensorChunkView& chunk) {
  std::string data;
  for (absl::string_view piece : chunk.data) absl::StrAppend(&data, piece);
  return data;
}

// Asserts that the decoded chunk holds what protobuf parsed.
void ExpectSameChunk(const TensorChunkView& view, const v1::TensorChunk& chunk) {
  EXPECT_EQ(view.param_id, chunk.param_id());
  EXPECT_EQ(view.offset, chunk.offset());
  EXPECT_EQ(view.dtype, static_cast<int>(chunk.dtype()));
  EXPECT_EQ(view.data_bytes, chunk.data().size());
  EXPECT_EQ(Joined(view), chunk.data());
}

// Asserts that `view` holds what protobuf parses from the same bytes.
void ExpectSameAsProtobuf(const std::string& wire, const StepRequestView& view) {
  v1::StepRequest expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  ASSERT_EQ(view.kind, expected.kind_case());
  switch (view.kind) {
    case v1::StepRequest::kHeader:
      EXPECT_EQ(view.header.SerializeAsString(), expected.header().SerializeAsString());
      break;
    case v1::StepRequest::kCommit:
      EXPECT_EQ(view.commit.num_elements(), expected.commit().num_elements());
      break;
    case v1::StepRequest::kGradient:
      ExpectSameChunk(view.gradient, expected.gradient());
      break;
    case v1::StepRequest::KIND_NOT_SET:
      break;
  }
}

std::vector<v1::StepRequest> Samples() {
  std::vector<v1::StepRequest> samples(6);
  v1::StepHeader* header = samples[0].mutable_header();
  header->set_session_id("s-1");
  header->set_step(7);
  header->set_trainer_id(3);
  header->add_groups()->set_lr(0.25);
  header->set_return_dtype(v1::DTYPE_BF16);
  header->add_return_param_ids(4);
  v1::TensorChunk* chunk = samples[1].mutable_gradient();
  chunk->set_param_id(5);
  chunk->set_offset(uint64_t{1} << 40);
  chunk->set_dtype(v1::DTYPE_FP16);
  for (int i = 0; i < 1000; ++i) chunk->mutable_data()->push_back(static_cast<char>(i * 7));
  samples[2].mutable_gradient()->set_dtype(v1::DTYPE_FP32);  // every other field at its default
  samples[3].mutable_gradient()->set_param_id(0xffffffffu);
  samples[3].mutable_gradient()->set_dtype(static_cast<v1::DType>(-2));  // an open enum value
  samples[4].mutable_commit()->set_num_elements(12345678901ull);
  // samples[5]: empty
  return samples;
}

TEST(RawStepCodecTest, DecodesWhatProtobufSerialisesWhereverTheSlicesAreCut) {
  for (const v1::StepRequest& request : Samples()) {
    const std::string wire = request.SerializeAsString();
    for (size_t slice_bytes :
         {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, wire.size() + 1}) {
      SCOPED_TRACE(
          absl::StrCat(request.ShortDebugString().substr(0, 80), " in slices of ", slice_bytes));
      StepRequestView view;
      const Decoded decoded = Decode(wire, view, slice_bytes);
      ASSERT_THAT(decoded.status, IsOk());
      ExpectSameAsProtobuf(wire, view);
    }
  }
}

TEST(RawStepCodecTest, GradientDataPointsIntoTheSlices) {
  const std::string wire = Samples()[1].SerializeAsString();
  grpc::ByteBuffer buffer = Buffer(wire, 100);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  StepRequestView view;
  ASSERT_THAT(DecodeStepRequest(buffer, view), IsOk());
  ASSERT_GT(view.gradient.data.size(), 5u);
  for (absl::string_view piece : view.gradient.data) {
    // Slices of a few bytes are stored inline, so Dump's copies hold them elsewhere.
    if (piece.size() <= GRPC_SLICE_INLINED_SIZE) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    bool inside = false;
    for (const grpc::Slice& s : slices)
      inside = inside || (p >= s.begin() && p + piece.size() <= s.end());
    EXPECT_TRUE(inside) << "a piece of " << piece.size() << " bytes is a copy";
  }
}

TEST(RawStepCodecTest, MergesRepeatedAndSwitchedKindsAsProtobufDoes) {
  const std::vector<v1::StepRequest> s = Samples();
  v1::StepRequest chunk_again;
  chunk_again.mutable_gradient()->set_offset(9);
  const std::vector<std::string> cases = {
      s[1].SerializeAsString() + chunk_again.SerializeAsString(),  // chunk fields merge
      s[0].SerializeAsString() + s[1].SerializeAsString(),         // gradient replaces header
      s[1].SerializeAsString() + s[4].SerializeAsString(),         // commit replaces gradient
      s[0].SerializeAsString() + s[0].SerializeAsString(),         // header merges with itself
      // An unknown field of each wire type (varint 9, fixed64 10, length 11, fixed32 12).
      std::string("\x48\x01\x51", 3) + std::string(8, 'x') + std::string("\x5a\x02yz\x65", 5) +
          std::string(4, 'w') + s[4].SerializeAsString(),
  };
  for (const std::string& wire : cases) {
    StepRequestView view;
    const Decoded decoded = Decode(wire, view, 3);
    ASSERT_THAT(decoded.status, IsOk());
    ExpectSameAsProtobuf(wire, view);
  }
}

TEST(RawStepCodecTest, MalformedInputIsInvalidArgument) {
  const struct {
    std::string wire;
    std::string message;
  } cases[] = {
      {std::string("\x12\x80", 2), "gradient (field 2) length: truncated varint"},
      {std::string("\x12\x03\x08\x80\x80", 5), "param_id: truncated varint"},
      {std::string("\x10\x01", 2), "gradient (field 2) has wire type 0, expected 2"},
      {std::string("\x12\x02\x0a\x00", 4), "param_id has wire type 2, expected 0"},
      {std::string("\x12\x03\x1d\x00\x00", 5), "dtype has wire type 5, expected 0"},
      {std::string("\x12\x05\x08\x01", 4),
       "gradient (field 2): length 5 runs past the end (2 bytes"},
      {std::string("\x12\x03\x22\x09\x01", 5), "data: length 9 runs past the end (1 bytes left)"},
      {std::string("\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 10),
       "length 9223372036854775807 runs"},
      {std::string("\x0a\x02\x08\x80", 4),
       "header (field 1) does not parse as optstep.v1.StepHeader"},
      {std::string("\x1a\x01\xff", 3), "commit (field 3) does not parse as optstep.v1.StepCommit"},
      {std::string("\x00\x01", 2), "truncated or invalid tag"},
      {std::string("\x80", 1), "truncated or invalid tag"},
      // Protobuf refuses a tag of more than 5 bytes, even one whose low 32 bits are a valid tag.
      {std::string("\x92\x80\x80\x80\x80\x00\x00", 7), "truncated or invalid tag"},
      {std::string("\xf8\xed\xfe\xf7\xed\xfe\xf8\x03\x00", 9), "truncated or invalid tag"},
      {std::string("\x92\x80\x80\x80\x10\x00", 6), "truncated or invalid tag"},  // over 32 bits
      {std::string("\x4f\x01", 2), "field 9 with wire type 7 cannot be skipped"},
      // An unknown field's length is read whole, not truncated to 32 bits.
      {std::string("\x4a\x80\x80\x80\x80\x80\x20", 7), "field 9: length 1099511627776 runs"},
      {std::string("\x4b\x08\x01", 3), "field 9: group does not end"},
      {std::string("\x4d\x01\x02", 3), "field 9: truncated"},
      {std::string("\x12\x02\x4e\x01", 4), "field 9 with wire type 6 cannot be skipped"},
  };
  for (const auto& c : cases) {
    StepRequestView view;
    EXPECT_THAT(Decode(c.wire, view, 1).status,
                StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << absl::CEscape(c.wire);
  }
}

// Every prefix and many random corruptions of valid messages: never a crash, only OK or
// INVALID_ARGUMENT, and what is accepted is what protobuf reads from the same bytes.
// Every prefix of `wire` and `corruptions` copies with one of its first 24 bytes replaced at
// random.
std::vector<std::string> TruncatedAndCorrupted(const std::string& wire, int corruptions,
                                               std::mt19937& rng) {
  std::vector<std::string> inputs;
  for (size_t n = 0; n < wire.size(); ++n) inputs.push_back(wire.substr(0, n));
  for (int i = 0; i < corruptions && !wire.empty(); ++i) {
    std::string corrupted = wire;
    corrupted[rng() % std::min<size_t>(corrupted.size(), 24)] = static_cast<char>(rng());
    inputs.push_back(corrupted);
  }
  return inputs;
}

TEST(RawStepCodecTest, TruncatedAndCorruptedMessagesNeverCrash) {
  std::mt19937 rng(42);
  for (const v1::StepRequest& request : Samples()) {
    for (const std::string& input : TruncatedAndCorrupted(request.SerializeAsString(), 300, rng)) {
      StepRequestView view;
      const Decoded decoded = Decode(input, view, 1 + rng() % 5);
      const absl::Status& status = decoded.status;
      if (status.ok()) {
        ExpectSameAsProtobuf(input, view);
      } else {
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      }
    }
  }
}

TEST(RawStepCodecTest, ParameterChunkIsProtobufsOwnSerialisation) {
  struct Case {
    uint32_t param_id;
    uint64_t offset;
    int dtype;
    std::string data;
  };
  const Case cases[] = {{0, 0, 0, ""},
                        {1, 0, v1::DTYPE_FP32, "abcd"},
                        {300, uint64_t{1} << 50, v1::DTYPE_BF16, std::string(70000, 'q')},
                        {0, 17, -1, "zz"}};
  for (const Case& c : cases) {
    v1::StepResponse response;
    v1::TensorChunk* chunk = response.mutable_parameter();
    chunk->set_param_id(c.param_id);
    chunk->set_offset(c.offset);
    chunk->set_dtype(static_cast<v1::DType>(c.dtype));
    chunk->set_data(c.data);
    EXPECT_EQ(EncodeParameterChunkHeader(c.param_id, c.offset, c.dtype, c.data.size()) + c.data,
              response.SerializeAsString())
        << response.ShortDebugString();
  }
}

TEST(RawStepCodecTest, ParameterChunkRefersToThePayloadUntilReleased) {
  const std::string payload(1000, 'p');
  int released = 0;
  {
    grpc::ByteBuffer message = EncodeParameterChunk(
        2, 8, v1::DTYPE_FP32, payload, [](void* arg) { ++*static_cast<int*>(arg); }, &released);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), payload.data());
    v1::StepResponse parsed;
    std::string wire;
    for (const grpc::Slice& s : slices)
      wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
    ASSERT_TRUE(parsed.ParseFromString(wire));
    EXPECT_EQ(parsed.parameter().param_id(), 2u);
    EXPECT_EQ(parsed.parameter().offset(), 8u);
    EXPECT_EQ(parsed.parameter().data(), payload);
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
}

// ---- StepResponse (the clients' side)

// Asserts that `view` holds what protobuf parses from `wire`.
void ExpectSameResponseAsProtobuf(const std::string& wire, const StepResponseView& view) {
  v1::StepResponse expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  ASSERT_EQ(view.kind, expected.kind_case());
  if (view.kind == v1::StepResponse::kResult) {
    EXPECT_EQ(view.result.SerializeAsString(), expected.result().SerializeAsString());
  } else if (view.kind == v1::StepResponse::kParameter) {
    ExpectSameChunk(view.parameter, expected.parameter());
  }
}

std::vector<std::string> ResponseSamples() {
  v1::StepResponse result;
  result.mutable_result()->set_step(12);
  result.mutable_result()->set_grad_norm(0.5);
  result.mutable_result()->set_clipped(true);
  result.mutable_result()->set_params_to_follow(148);
  v1::StepResponse parameter;
  parameter.mutable_parameter()->set_param_id(3);
  parameter.mutable_parameter()->set_offset(uint64_t{1} << 33);
  parameter.mutable_parameter()->set_dtype(v1::DTYPE_BF16);
  for (int i = 0; i < 999; ++i) parameter.mutable_parameter()->mutable_data()->push_back(i * 5);
  v1::StepResponse defaults;
  defaults.mutable_parameter();  // every field at its default
  return {result.SerializeAsString(), parameter.SerializeAsString(), defaults.SerializeAsString(),
          std::string(),
          parameter.SerializeAsString() + result.SerializeAsString(),  // the result replaces it
          result.SerializeAsString() + parameter.SerializeAsString(),
          // Unknown fields (varint 9, length 11) are skipped.
          std::string("\x48\x01\x5a\x02yz", 6) + parameter.SerializeAsString()};
}

TEST(RawStepCodecTest, DecodesStepResponsesAsProtobufDoesWhereverTheSlicesAreCut) {
  for (const std::string& wire : ResponseSamples()) {
    for (size_t slice_bytes : {size_t{1}, size_t{3}, size_t{64}, wire.size() + 1}) {
      SCOPED_TRACE(absl::StrCat(absl::CEscape(wire.substr(0, 24)), " in slices of ", slice_bytes));
      grpc::ByteBuffer buffer = Buffer(wire, slice_bytes);
      StepResponseView view;
      ASSERT_THAT(DecodeStepResponse(buffer, view), IsOk());
      ExpectSameResponseAsProtobuf(wire, view);
    }
  }
}

TEST(RawStepCodecTest, AnEncodedParameterChunkDecodesToViewsOfItsPayload) {
  std::string payload(64 << 10, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 13);
  grpc::ByteBuffer message = EncodeParameterChunk(
      7, 4096, v1::DTYPE_FP32, payload, [](void*) {}, nullptr);
  StepResponseView view;
  ASSERT_THAT(DecodeStepResponse(message, view), IsOk());
  ASSERT_EQ(view.kind, v1::StepResponse::kParameter);
  EXPECT_EQ(view.parameter.param_id, 7u);
  EXPECT_EQ(view.parameter.offset, 4096u);
  EXPECT_EQ(view.parameter.dtype, v1::DTYPE_FP32);
  EXPECT_EQ(Joined(view.parameter), payload);
  ASSERT_EQ(view.parameter.data.size(), 1u);
  EXPECT_EQ(view.parameter.data[0].data(), payload.data()) << "the payload was copied";
}

TEST(RawStepCodecTest, MalformedResponseIsInvalidArgumentNamingStepResponse) {
  const struct {
    std::string wire;
    std::string message;
  } cases[] = {
      {std::string("\x0a\x02\x08\x80", 4),
       "malformed StepResponse: result (field 1) does not parse as optstep.v1.StepResult"},
      {std::string("\x12\x05\x08\x01", 4),
       "malformed StepResponse: parameter (field 2): length 5 runs past the end (2 bytes"},
      {std::string("\x12\x03\x22\x09\x01", 5),
       "malformed StepResponse: data: length 9 runs past the end (1 bytes left)"},
      {std::string("\x10\x01", 2), "parameter (field 2) has wire type 0, expected 2"},
      {std::string("\x80", 1), "malformed StepResponse: StepResponse: truncated or invalid tag"},
  };
  for (const auto& c : cases) {
    grpc::ByteBuffer buffer = Buffer(c.wire, 1);
    StepResponseView view;
    EXPECT_THAT(DecodeStepResponse(buffer, view),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message))
        << absl::CEscape(c.wire);
  }
}

// Every prefix and random corruptions of valid responses: OK only for what protobuf reads the
// same way, else INVALID_ARGUMENT.
TEST(RawStepCodecTest, TruncatedAndCorruptedResponsesNeverCrash) {
  std::mt19937 rng(7);
  for (const std::string& wire : ResponseSamples()) {
    for (const std::string& input : TruncatedAndCorrupted(wire, 200, rng)) {
      grpc::ByteBuffer buffer = Buffer(input, 1 + rng() % 5);
      StepResponseView view;
      const absl::Status status = DecodeStepResponse(buffer, view);
      if (status.ok()) {
        ExpectSameResponseAsProtobuf(input, view);
      } else {
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      }
    }
  }
}

}  // namespace
}  // namespace optstep
