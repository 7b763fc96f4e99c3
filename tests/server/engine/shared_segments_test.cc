// SharedSegments: a segment is laid out over the rank's own parameters only (gradients, then
// values, each at a 64-byte boundary, after the token), takes its bytes from the rank's budget and
// gives them back when replaced or dropped with its session; a step may name only the current
// segment of its own session and trainer.

#include "server/engine/shared_segments.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

std::vector<ParamInfo> Params(const std::vector<int64_t>& numels) {
  std::vector<ParamInfo> params;
  for (size_t i = 0; i < numels.size(); ++i) {
    params.push_back(ParamInfo{"p" + std::to_string(i), {numels[i]}});
  }
  return params;
}

TEST(SharedSegmentsTest, LaysOutTheRanksOwnParametersAlignedAfterTheToken) {
  MemoryBudget budget(1 << 20, 1);
  SharedSegments segments(&budget, /*rank=*/1);
  const Layout layout{2, {0, 1, 1, 0, 1}};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto segment,
                               segments.Attach("s", 0, Params({5, 3, 17, 9, 16}), layout));
  EXPECT_EQ(segment->params, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(segment->numels, (std::vector<int64_t>{3, 17, 16}));
  EXPECT_EQ(segment->offsets, (std::vector<int64_t>{0, 64, 192}));  // 12 -> 64, 68 -> 128, 64
  EXPECT_EQ(segment->gradients_offset, 64);
  EXPECT_EQ(segment->parameters_offset, 64 + 256);
  EXPECT_EQ(segment->memory->size(), 64u + 2 * 256);
  ASSERT_EQ(segment->token.size(), SharedSegment::kTokenBytes);
  EXPECT_EQ(std::memcmp(segment->memory->data(), segment->token.data(), 16), 0);
  EXPECT_EQ(segment->gradient(2), segment->memory->data() + 64 + 192);
  EXPECT_EQ(segment->value(1), segment->memory->data() + 320 + 64);
  EXPECT_EQ(budget.admitted(), 64 + 2 * 256);
}

TEST(SharedSegmentsTest, TakesItsBytesFromTheBudgetAndGivesThemBack) {
  MemoryBudget budget(4096, 0);
  SharedSegments segments(&budget, 0);
  const Layout layout{1, {0}};
  EXPECT_THAT(segments.Attach("big", 0, Params({1000}), layout).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "session 'big'"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto first, segments.Attach("s", 0, Params({400}), layout));
  EXPECT_EQ(budget.admitted(), 64 + 2 * 1600);
  first.reset();
  // Attaching again replaces the segment: the old one's bytes come back once nothing maps it.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto second, segments.Attach("s", 0, Params({400}), layout));
  EXPECT_EQ(budget.admitted(), 64 + 2 * 1600);
  EXPECT_EQ(segments.bytes(), 64 + 2 * 1600);
  segments.Drop("s", 1);  // another trainer's: nothing
  EXPECT_EQ(segments.bytes(), 64 + 2 * 1600);
  segments.DropSession("s");
  EXPECT_EQ(budget.admitted(), 64 + 2 * 1600);  // a step still holds it
  second.reset();
  EXPECT_EQ(budget.admitted(), 0);
  EXPECT_EQ(segments.bytes(), 0);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto third, segments.Attach("s", 2, Params({400}), layout));
  third.reset();
  segments.Drop("s", 2);  // a client that could not open it
  EXPECT_EQ(budget.admitted(), 0);
}

TEST(SharedSegmentsTest, ARankSharesAtMostItsLimitOfSegments) {
  // Each segment holds a descriptor: a session of thousands of trainers would hold thousands.
  MemoryBudget budget(1 << 20, 0);
  SharedSegments segments(&budget, 0, /*max_segments=*/2);
  const Layout layout{1, {0}};
  ASSERT_THAT(segments.Attach("s", 0, Params({4}), layout).status(), IsOk());
  ASSERT_THAT(segments.Attach("s", 1, Params({4}), layout).status(), IsOk());
  EXPECT_THAT(
      segments.Attach("s", 2, Params({4}), layout).status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               "rank 0 shares 2 memory segments with trainers, the most it shares at once "
               "(--max_shared_segments); trainer 2 of session 's' steps through its stream"));
  // A trainer that attaches again replaces its segment.
  ASSERT_THAT(segments.Attach("s", 1, Params({4}), layout).status(), IsOk());
  segments.DropSession("s");
  EXPECT_THAT(segments.Attach("t", 0, Params({4}), layout).status(), IsOk());
}

// A segment replaced or dropped while a step still maps it keeps its descriptor: it counts
// against the rank's limit (and its session's count, which its owner's share reads) until the
// step lets it go. Before, a trainer that attached again after each step's commit could hold a
// descriptor per stream beyond the limit.
TEST(SharedSegmentsTest, AReplacedSegmentAStepStillMapsCountsUntilItIsLetGo) {
  MemoryBudget budget(1 << 20, 0);
  SharedSegments segments(&budget, 0, /*max_segments=*/2);
  const Layout layout{1, {0}};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto mapped, segments.Attach("s", 0, Params({4}), layout));
  ASSERT_THAT(segments.Attach("s", 0, Params({4}), layout).status(), IsOk());
  EXPECT_EQ(segments.count("s", 0), 2);
  EXPECT_EQ(segments.current("s", 0), 1);
  EXPECT_THAT(segments.Attach("s", 1, Params({4}), layout).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "rank 0 shares 2 memory segments"));
  mapped.reset();  // the step is done with it
  EXPECT_EQ(segments.count("s", 0), 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto other, segments.Attach("s", 1, Params({4}), layout));
  // Dropped with its session, a segment a step maps counts the same way.
  segments.DropSession("s");
  EXPECT_EQ(segments.count("s"), 1);
  EXPECT_THAT(segments.Attach("t", 0, Params({4}), layout).status(), IsOk());
  EXPECT_THAT(segments.Attach("t", 1, Params({4}), layout).status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  other.reset();
  EXPECT_EQ(segments.count("s"), 0);
  EXPECT_THAT(segments.Attach("t", 1, Params({4}), layout).status(), IsOk());
}

TEST(SharedSegmentsTest, AStepFindsOnlyTheCurrentSegmentOfItsSessionAndTrainer) {
  MemoryBudget budget(1 << 20, 0);
  SharedSegments segments(&budget, 0);
  const Layout layout{1, {0, 0}};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto mine, segments.Attach("s", 1, Params({8, 8}), layout));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto other, segments.Attach("t", 1, Params({8, 8}), layout));
  EXPECT_THAT(segments.Find("s", 1, mine->id), IsOk());
  EXPECT_THAT(segments.Find("s", 0, mine->id).status(),
              StatusIs(absl::StatusCode::kNotFound, "not the segment of trainer 0 of session 's'"));
  EXPECT_THAT(segments.Find("s", 1, other->id).status(), StatusIs(absl::StatusCode::kNotFound));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto again, segments.Attach("s", 1, Params({8, 8}), layout));
  EXPECT_NE(again->id, mine->id);
  EXPECT_THAT(segments.Find("s", 1, mine->id).status(), StatusIs(absl::StatusCode::kNotFound));
  segments.DropSession("s");
  EXPECT_THAT(segments.Find("s", 1, again->id).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(segments.Find("t", 1, other->id), IsOk());
}

}  // namespace
}  // namespace optstep
