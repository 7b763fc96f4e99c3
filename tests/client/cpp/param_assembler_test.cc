#include "client/cpp/param_assembler.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;

SessionLayout Layout() { return SessionLayout("s", 1, {{"w", 5, 0}, {"b", 2, 0}, {"g", 1, 0}}); }

std::string F32Bytes(std::vector<float> values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string U16Bytes(std::vector<uint16_t> values) {
  std::string bytes(values.size() * 2, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(ParamAssemblerTest, AssemblesChunksInAnyOrder) {
  const SessionLayout layout = Layout();
  const std::vector<uint32_t> ids = {0, 1};
  ParamAssembler assembler(layout, DType::kF32, ids);
  EXPECT_THAT(assembler.Add(0, 3, DType::kF32, F32Bytes({3, 4})), IsOk());
  EXPECT_THAT(assembler.Add(1, 0, DType::kF32, F32Bytes({-1, -2})), IsOk());
  EXPECT_THAT(assembler.Add(0, 0, DType::kF32, F32Bytes({0, 1, 2})), IsOk());
  EXPECT_EQ(assembler.chunks_added(), 3u);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(HostParameterMap params, assembler.Finish());
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].param_id, 0u);
  EXPECT_EQ(params[0].dtype, DType::kF32);
  EXPECT_THAT(params[0].f32, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_TRUE(params[0].bf16.empty());
  EXPECT_THAT(params[1].f32, ElementsAre(-1, -2));
}

TEST(ParamAssemblerTest, AssemblesAChunkFromPiecesCutInsideElements) {
  const SessionLayout layout = Layout();
  ParamAssembler assembler(layout, DType::kF32, std::vector<uint32_t>{0});
  const std::string bytes = F32Bytes({5, 6, 7});
  // Cut as received slices may be: inside the first and the third element, and an empty piece.
  const absl::string_view pieces[] = {absl::string_view(bytes).substr(0, 3),
                                      absl::string_view(bytes).substr(3, 6), absl::string_view(),
                                      absl::string_view(bytes).substr(9)};
  EXPECT_THAT(assembler.Add(0, 2, DType::kF32, pieces), IsOk());
  EXPECT_THAT(assembler.Add(0, 0, DType::kF32, F32Bytes({1, 2})), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(HostParameterMap params, assembler.Finish());
  EXPECT_THAT(params[0].f32, ElementsAre(1, 2, 5, 6, 7));
  // The pieces' sum is what is checked: 3 bytes are not an element.
  const absl::string_view odd[] = {absl::string_view(bytes).substr(0, 1),
                                   absl::string_view(bytes).substr(1, 2)};
  ParamAssembler again(layout, DType::kF32, std::vector<uint32_t>{0});
  EXPECT_THAT(again.Add(0, 0, DType::kF32, odd),
              StatusIs(absl::StatusCode::kInternal, "chunk of 3 bytes at element 0"));
}

TEST(ParamAssemblerTest, WritesIntoDestinationsAndTellsWhenEachIsWhole) {
  const SessionLayout layout = Layout();
  ParamAssembler assembler(layout, DType::kF32, {});
  std::vector<float> w(5, -9.0f);
  EXPECT_THAT(assembler.SetDestination(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(w.data()), 16)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "destination of param 'w' has 16 "
                       "bytes, expected 20 (5 fp32 elements)"));
  ASSERT_THAT(assembler.SetDestination(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(w.data()), 20)),
              IsOk());
  std::vector<uint32_t> ready;
  assembler.OnReady([&](uint32_t id) { ready.push_back(id); });
  EXPECT_THAT(assembler.Add(0, 3, DType::kF32, F32Bytes({3, 4})), IsOk());
  EXPECT_THAT(assembler.Add(1, 0, DType::kF32, F32Bytes({-1, -2})), IsOk());
  EXPECT_THAT(ready, ElementsAre(1u));
  EXPECT_THAT(w, ElementsAre(-9, -9, -9, 3, 4));  // written as it arrives
  EXPECT_THAT(assembler.Add(0, 0, DType::kF32, F32Bytes({0, 1, 2})), IsOk());
  EXPECT_THAT(assembler.Add(2, 0, DType::kF32, F32Bytes({7})), IsOk());
  EXPECT_THAT(ready, ElementsAre(1u, 0u, 2u));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(HostParameterMap params, assembler.Finish());
  EXPECT_THAT(w, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(params.count(0), 0u);  // it went to its destination
  EXPECT_THAT(params[1].f32, ElementsAre(-1, -2));
  EXPECT_EQ(assembler.destinations_filled(), 1u);
}

TEST(ParamAssemblerTest, ADestinationIsCheckedForCoverage) {
  const SessionLayout layout = Layout();
  const std::vector<uint32_t> ids = {1};
  ParamAssembler assembler(layout, DType::kF32, ids);
  std::vector<float> b(2);
  EXPECT_THAT(assembler.SetDestination(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(b.data()), 8)),
              StatusIs(absl::StatusCode::kInvalidArgument));  // not returned
  ASSERT_THAT(assembler.SetDestination(1, absl::MakeSpan(reinterpret_cast<uint8_t*>(b.data()), 8)),
              IsOk());
  EXPECT_THAT(assembler.Add(1, 0, DType::kF32, F32Bytes({1})), IsOk());
  EXPECT_THAT(assembler.Add(1, 0, DType::kF32, F32Bytes({1})), IsOk());
  EXPECT_THAT(assembler.Finish().status(), StatusIs(absl::StatusCode::kInternal));
}

TEST(ParamAssemblerTest, AssemblesBf16AsRawBits) {
  const SessionLayout layout = Layout();
  const std::vector<uint32_t> ids = {1};
  ParamAssembler assembler(layout, DType::kBF16, ids);
  EXPECT_THAT(assembler.Add(1, 1, DType::kBF16, U16Bytes({0x4000})), IsOk());
  EXPECT_THAT(assembler.Add(1, 0, DType::kBF16, U16Bytes({0x3f80})), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(HostParameterMap params, assembler.Finish());
  EXPECT_EQ(params[1].dtype, DType::kBF16);
  EXPECT_THAT(params[1].bf16, ElementsAre(0x3f80, 0x4000));
  EXPECT_EQ(params[1].size(), 2u);
}

TEST(ParamAssemblerTest, EmptyExpectedMeansEveryParameter) {
  const SessionLayout layout = Layout();
  ParamAssembler assembler(layout, DType::kF32, {});
  EXPECT_THAT(assembler.Add(0, 0, DType::kF32, F32Bytes({0, 1, 2, 3, 4})), IsOk());
  EXPECT_THAT(assembler.Add(2, 0, DType::kF32, F32Bytes({7})), IsOk());
  EXPECT_THAT(assembler.Finish(),
              StatusIs(absl::StatusCode::kInternal, "server did not send param 'b' (id 1)"));
}

TEST(ParamAssemblerTest, RejectsChunksTheServerShouldNotSend) {
  const SessionLayout layout = Layout();
  const std::vector<uint32_t> ids = {0};
  ParamAssembler assembler(layout, DType::kF32, ids);
  EXPECT_THAT(assembler.Add(7, 0, DType::kF32, F32Bytes({1})),
              StatusIs(absl::StatusCode::kInternal, "param_id 7"));
  EXPECT_THAT(assembler.Add(1, 0, DType::kF32, F32Bytes({1})),
              StatusIs(absl::StatusCode::kInternal, "param 'b' (id 1), not asked for"));
  EXPECT_THAT(assembler.Add(0, 0, DType::kBF16, U16Bytes({1})),
              StatusIs(absl::StatusCode::kInternal, "as bf16, asked for fp32"));
  EXPECT_THAT(assembler.Add(0, 4, DType::kF32, F32Bytes({1, 2})),
              StatusIs(absl::StatusCode::kInternal, "at element 4, which does not fit its 5"));
  EXPECT_THAT(assembler.Add(0, 0, DType::kF32, std::string(3, '\0')),
              StatusIs(absl::StatusCode::kInternal, "3 bytes"));
}

TEST(ParamAssemblerTest, FinishDetectsGapsAndOverlaps) {
  const SessionLayout layout = Layout();
  const std::vector<uint32_t> ids = {0};
  {
    ParamAssembler gap(layout, DType::kF32, ids);
    EXPECT_THAT(gap.Add(0, 0, DType::kF32, F32Bytes({0, 1})), IsOk());
    EXPECT_THAT(gap.Add(0, 3, DType::kF32, F32Bytes({3, 4})), IsOk());
    EXPECT_THAT(gap.Finish(), StatusIs(absl::StatusCode::kInternal,
                                       "param 'w' incomplete: elements from 2 of 5"));
  }
  {
    ParamAssembler overlap(layout, DType::kF32, ids);
    EXPECT_THAT(overlap.Add(0, 0, DType::kF32, F32Bytes({0, 1, 2})), IsOk());
    EXPECT_THAT(overlap.Add(0, 2, DType::kF32, F32Bytes({2, 3, 4})), IsOk());
    EXPECT_THAT(overlap.Finish(),
                StatusIs(absl::StatusCode::kInternal, "elements [2, 3) more than once"));
  }
}

TEST(ValidateParamIdsTest, RejectsUnknownAndDuplicateIds) {
  const SessionLayout layout = Layout();
  EXPECT_THAT(ValidateParamIds(layout, std::vector<uint32_t>{2, 0}), IsOk());
  EXPECT_THAT(ValidateParamIds(layout, std::vector<uint32_t>{0, 3}),
              StatusIs(absl::StatusCode::kNotFound, "param_id 3"));
  EXPECT_THAT(ValidateParamIds(layout, std::vector<uint32_t>{1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b' (id 1) is named twice"));
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
