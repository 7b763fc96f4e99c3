// StateDictAssembler: an imported tensor counts only when every element arrived exactly once.

#include "server/rpc/state_dict_stream.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// A chunk of the fp32 tensor "param/w" of `numel` elements: elements [offset, offset + n).
v1::StateDictChunk Chunk(uint64_t numel, uint64_t offset, uint64_t n) {
  v1::StateDictChunk chunk;
  chunk.set_key("param/w");
  chunk.set_dtype(v1::DTYPE_FP32);
  chunk.add_shape(numel);
  chunk.set_offset(offset);
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i) values[i] = static_cast<float>(offset + i);
  chunk.set_data(std::string(reinterpret_cast<const char*>(values.data()), n * sizeof(float)));
  return chunk;
}

TEST(StateDictAssemblerTest, ChunksInAnyOrderThatCoverEveryElementOnceAreComplete) {
  StateDictAssembler assembler;
  ASSERT_THAT(assembler.Add(Chunk(10, 6, 4)), IsOk());
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 6)), IsOk());
  EXPECT_THAT(assembler.CheckComplete(), IsOk());
  EXPECT_EQ(assembler.bytes(), 40u);
  EXPECT_EQ(assembler.tensors(), 1u);
}

TEST(StateDictAssemblerTest, AMissingTailIsNamed) {
  StateDictAssembler assembler;
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 6)), IsOk());
  EXPECT_THAT(assembler.CheckComplete(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "state dict key 'param/w' (10 elements): elements [6, 10) never arrived"));
}

TEST(StateDictAssemblerTest, AGapIsNamed) {
  StateDictAssembler assembler;
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 3)), IsOk());
  ASSERT_THAT(assembler.Add(Chunk(10, 5, 5)), IsOk());
  EXPECT_THAT(assembler.CheckComplete(),
              StatusIs(absl::StatusCode::kInvalidArgument, "elements [3, 5) never arrived"));
}

TEST(StateDictAssemblerTest, AnOverlapIsNamedEvenWhenTheBytesAddUp) {
  StateDictAssembler assembler;
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 6)), IsOk());
  ASSERT_THAT(assembler.Add(Chunk(10, 4, 4)), IsOk());  // 6 + 4 = 10 elements, [8, 10) missing
  EXPECT_THAT(assembler.CheckComplete(),
              StatusIs(absl::StatusCode::kInvalidArgument, "elements [4, 6) arrived twice"));
}

TEST(StateDictAssemblerTest, AChunkPastTheEndIsRefusedAtOnce) {
  StateDictAssembler assembler;
  EXPECT_THAT(assembler.Add(Chunk(10, 8, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds 40 bytes"));
}

}  // namespace
}  // namespace optstep
