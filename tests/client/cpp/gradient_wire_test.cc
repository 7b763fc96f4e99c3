#include "client/cpp/gradient_wire.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace client_internal {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>& slices) {
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& s : slices) wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return wire;
}

TEST(GradientWireTest, MessageIsProtobufsOwnSerialisationAndRefersToTheGradient) {
  std::vector<uint8_t> bytes(70000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13);
  struct Case {
    uint32_t param_id;
    uint64_t offset;
    DType dtype;
    size_t size;
  };
  for (const Case& c : {Case{0, 0, DType::kF32, 4}, Case{7, 1000, DType::kBF16, 2},
                        Case{1u << 20, uint64_t{1} << 45, DType::kF16, 70000},
                        Case{3, 0, DType::kF32, 128}}) {
    GradientSlice chunk;
    chunk.param_id = c.param_id;
    chunk.offset = c.offset;
    chunk.dtype = c.dtype;
    chunk.bytes = absl::MakeConstSpan(bytes.data(), c.size);
    v1::StepRequest expected;
    v1::TensorChunk* gradient = expected.mutable_gradient();
    gradient->set_param_id(c.param_id);
    gradient->set_offset(c.offset);
    gradient->set_dtype(c.dtype == DType::kF32    ? v1::DTYPE_FP32
                        : c.dtype == DType::kBF16 ? v1::DTYPE_BF16
                                                  : v1::DTYPE_FP16);
    gradient->set_data(bytes.data(), c.size);

    int released = 0;
    {
      grpc::ByteBuffer message = GradientChunkMessage(
          chunk, [](void* arg) { ++*static_cast<int*>(arg); }, &released);
      std::vector<grpc::Slice> slices;
      EXPECT_EQ(Flatten(message, slices), expected.SerializeAsString());
      ASSERT_EQ(slices.size(), 2u);
      EXPECT_EQ(slices[1].begin(), bytes.data()) << "the payload was copied";
      EXPECT_EQ(released, 0);
    }
    EXPECT_EQ(released, 1) << "the payload slice was not released exactly once";
  }
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
