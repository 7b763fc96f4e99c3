// StateDictAssembler: an imported tensor counts only when every element arrived exactly once.
// ForEachStateChunk: the chunks it cuts are whole elements within the chunk limit, and assemble
// back into the tensor.

#include "server/rpc/state_dict_stream.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/tensor.h"
#include "tests/testing/status_matchers.h"
#include "wire/chunk.h"

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

TEST(StateDictAssemblerTest, APieceSentAgainAndAgainIsRefusedOnceOverTheDeclaredBytes) {
  // Each copy would add to what the stream holds until its end found the overlap.
  StateDictAssembler assembler;
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 4)), IsOk());
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 4)), IsOk());  // 32 of 40 bytes: not over yet
  EXPECT_THAT(assembler.Add(Chunk(10, 0, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "brings the data to 48 bytes, over the 40 bytes the tensors declare"));
}

TEST(StateDictAssemblerTest, AShapeOverTheLimitIsRefusedBeforeItIsMade) {
  StateDictAssembler assembler;
  assembler.set_byte_limit(1 << 20);
  v1::StateDictChunk wraps = Chunk(10, 0, 1);
  wraps.clear_shape();
  wraps.add_shape(uint64_t{1} << 32);  // 2^64 bytes: wrapped around to 0 before
  wraps.add_shape(uint64_t{1} << 30);
  EXPECT_THAT(assembler.Add(wraps),
              StatusIs(absl::StatusCode::kResourceExhausted, "is over the 1048576 bytes"));
  EXPECT_EQ(assembler.tensors(), 0u);
}

// A shape of more dimensions than a tensor may have is refused before it is copied: each copy of
// a shape of millions of ones took tens of MB that no budget counts.
TEST(StateDictAssemblerTest, AShapeOfTooManyDimensionsIsRefused) {
  StateDictAssembler assembler;
  v1::StateDictChunk ones = Chunk(1, 0, 1);
  for (int d = 0; d < kMaxDims; ++d) ones.add_shape(1);
  EXPECT_THAT(assembler.Add(ones),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "state dict key 'param/w': 65 dimensions (at most 64)"));
  EXPECT_EQ(assembler.tensors(), 0u);
}

// A new tensor's bytes are asked for before they are made (the stream's StagingCharge); a
// refusal refuses the chunk, and the tensor is not kept.
TEST(StateDictAssemblerTest, ATensorsBytesAreReservedBeforeTheyAreMade) {
  StateDictAssembler assembler;
  std::vector<uint64_t> asked;
  assembler.set_reserve([&asked](uint64_t bytes) {
    asked.push_back(bytes);
    return asked.size() == 1 ? absl::OkStatus() : absl::ResourceExhaustedError("budget");
  });
  ASSERT_THAT(assembler.Add(Chunk(10, 0, 4)), IsOk());
  ASSERT_THAT(assembler.Add(Chunk(10, 4, 6)), IsOk());  // the same tensor: nothing more asked
  v1::StateDictChunk other = Chunk(1000, 0, 1);
  other.set_key("param/v");
  EXPECT_THAT(assembler.Add(other), StatusIs(absl::StatusCode::kResourceExhausted, "budget"));
  EXPECT_EQ(asked, (std::vector<uint64_t>{40, 4000}));
  EXPECT_EQ(assembler.tensors(), 1u);
  EXPECT_THAT(assembler.CheckComplete(), IsOk());
}

// Every range of elements is kept until the end: a stream of tiny chunks out of order is
// refused once it sent more ranges apart than one per tensor and per kSmallChunkBytes declared,
// and kSpareChunks. Before, a tensor sent an element a chunk held about four times its bytes in
// ranges.
TEST(StateDictAssemblerTest, TooManyRangesApartForTheBytesDeclaredAreRefused) {
  StateDictAssembler assembler;
  const uint64_t numel = StateDictAssembler::kSmallChunkBytes / 4 * 2;  // two small chunks' worth
  const uint64_t most = 1 + 2 + StateDictAssembler::kSpareChunks;
  for (uint64_t i = 0; i < most; ++i) {
    ASSERT_THAT(assembler.Add(Chunk(numel, 2 * i, 1)), IsOk()) << i;  // every other element
  }
  EXPECT_THAT(assembler.Add(Chunk(numel, 2 * most, 1)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("more than ", most, " ranges of elements for 1 tensors")));
}

// Small chunks in order extend their tensor's range: a client set to small chunks imports a
// tensor of any size (here 4096 chunks of 1 KiB).
TEST(StateDictAssemblerTest, SmallChunksInOrderAreOneRange) {
  StateDictAssembler assembler;
  const uint64_t numel = 4096 * 256;
  for (uint64_t offset = 0; offset < numel; offset += 256) {
    ASSERT_THAT(assembler.Add(Chunk(numel, offset, 256)), IsOk()) << offset;
  }
  EXPECT_THAT(assembler.CheckComplete(), IsOk());
}

TEST(StateDictAssemblerTest, EmptyChunksAndLongKeysAreRefused) {
  StateDictAssembler assembler;
  v1::StateDictChunk empty = Chunk(10, 0, 0);
  EXPECT_THAT(assembler.Add(empty),
              StatusIs(absl::StatusCode::kInvalidArgument, "a chunk without data"));
  v1::StateDictChunk long_key = Chunk(10, 0, 10);
  long_key.set_key(std::string(StateDictAssembler::kMaxStateKeyBytes + 1, 'k'));
  EXPECT_THAT(assembler.Add(long_key),
              StatusIs(absl::StatusCode::kInvalidArgument, "over the 4096 a key or name may have"));
  EXPECT_EQ(assembler.tensors(), 0u);
}

TEST(StateDictAssemblerTest, AChunkPastTheEndIsRefusedAtOnce) {
  StateDictAssembler assembler;
  EXPECT_THAT(assembler.Add(Chunk(10, 8, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds 40 bytes"));
}

TEST(StateDictAssemblerTest, AnOffsetThatWouldWrapInBytesIsRefused) {
  // 2^62 fp32 elements are 2^64 bytes: as a byte offset it would be 0.
  StateDictAssembler assembler;
  EXPECT_THAT(assembler.Add(Chunk(10, uint64_t{1} << 62, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds 40 bytes"));
  EXPECT_THAT(assembler.Add(Chunk(10, kMaxChunkOffset + 1, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
}

// An int64 tensor of `numel` elements whose element i is i.
StateTensor Counting(int64_t numel) {
  StateTensor tensor;
  tensor.type = StateTensor::Type::kI64;
  tensor.shape = {numel};
  std::vector<int64_t> values(numel);
  for (int64_t i = 0; i < numel; ++i) values[i] = i;
  tensor.bytes.assign(reinterpret_cast<const char*>(values.data()), numel * sizeof(int64_t));
  return tensor;
}

TEST(ForEachStateChunkTest, ChunksAreWholeElementsWithinTheLimitAndAssembleBack) {
  const int64_t numel = kMaxChunkBytes / 8 * 2 + 3;  // two full chunks and a short one
  const StateTensor tensor = Counting(numel);
  StateDictAssembler assembler;
  v1::StateDictChunk chunk;
  std::vector<size_t> sizes;
  ASSERT_TRUE(ForEachStateChunk({"model0", "", "state/adam/w/exp_avg", &tensor}, &chunk, [&] {
    sizes.push_back(chunk.data().size());
    EXPECT_EQ(chunk.chunk_key(), "model0");
    EXPECT_EQ(chunk.dtype(), v1::DTYPE_INT64);
    return assembler.Add(chunk).ok();
  }));
  EXPECT_EQ(sizes, (std::vector<size_t>{kMaxChunkBytes, kMaxChunkBytes, 24}));
  ASSERT_THAT(assembler.CheckComplete(), IsOk());
  EXPECT_EQ(assembler.bytes(), tensor.bytes.size());
}

TEST(ForEachStateChunkTest, StopsWhenASendFails) {
  const StateTensor tensor = Counting(kMaxChunkBytes / 8 * 3);
  v1::StateDictChunk chunk;
  int sent = 0;
  EXPECT_FALSE(ForEachStateChunk({"", "", "k", &tensor}, &chunk, [&] { return ++sent < 2; }));
  EXPECT_EQ(sent, 2);
}

}  // namespace
}  // namespace optstep
