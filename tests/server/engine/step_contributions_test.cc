#include "server/engine/step_contributions.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

const std::vector<std::string> kNames = {"a", "b"};

TEST(StepContributionsTest, ShardedRangesFromSeveralTrainersCompleteTogether) {
  StepContributions c(GradientMode::kSharded, 2, {10, 4}, &kNames);
  EXPECT_FALSE(c.started());
  ASSERT_THAT(c.AddRange(0, 0, 0, 4), IsOk());
  ASSERT_THAT(c.AddRange(1, 0, 4, 6), IsOk());
  EXPECT_TRUE(c.started());
  EXPECT_THAT(c.CheckAllComplete(),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b': gradient elements [0, 4)"));
  ASSERT_THAT(c.AddRange(1, 1, 2, 2), IsOk());
  EXPECT_THAT(c.CheckAllComplete(), StatusIs(absl::StatusCode::kInvalidArgument, "[0, 2) of 4"));
  ASSERT_THAT(c.AddRange(0, 1, 0, 2), IsOk());
  EXPECT_THAT(c.CheckAllComplete(), IsOk());
  EXPECT_EQ(c.elements_from(0), 6);
  EXPECT_EQ(c.elements_from(1), 8);
}

TEST(StepContributionsTest, GapInTheMiddleIsNamed) {
  StepContributions c(GradientMode::kSharded, 1, {10}, &kNames);
  ASSERT_THAT(c.AddRange(0, 0, 0, 3), IsOk());
  ASSERT_THAT(c.AddRange(0, 0, 7, 3), IsOk());
  EXPECT_THAT(c.CheckAllComplete(), StatusIs(absl::StatusCode::kInvalidArgument, "[3, 7) of 10"));
}

TEST(StepContributionsTest, OverlapsAreRefusedAcrossTrainersWhenSharded) {
  StepContributions c(GradientMode::kSharded, 2, {10}, &kNames);
  ASSERT_THAT(c.AddRange(0, 0, 2, 4), IsOk());
  EXPECT_THAT(c.AddRange(1, 0, 0, 3), StatusIs(absl::StatusCode::kInvalidArgument, "overlaps"));
  EXPECT_THAT(c.AddRange(1, 0, 5, 3), StatusIs(absl::StatusCode::kInvalidArgument, "overlaps"));
  EXPECT_THAT(c.AddRange(1, 0, 2, 4), StatusIs(absl::StatusCode::kInvalidArgument, "duplicates"));
  EXPECT_THAT(c.AddRange(1, 0, 0, 2), IsOk());   // adjacent is fine
  EXPECT_THAT(c.AddRange(1, 0, 6, 4), IsOk());
  EXPECT_THAT(c.AddRange(1, 0, 10, 1), StatusIs(absl::StatusCode::kInvalidArgument, "exceeds 10"));
  EXPECT_THAT(c.AddRange(1, 0, 3, 0), StatusIs(absl::StatusCode::kInvalidArgument, "empty chunk"));
}

TEST(StepContributionsTest, ReplicatedTrainersEachCoverEverything) {
  StepContributions c(GradientMode::kReplicated, 2, {4, 2}, &kNames);
  ASSERT_THAT(c.AddRange(0, 0, 0, 4), IsOk());
  ASSERT_THAT(c.AddRange(1, 0, 0, 4), IsOk());  // same range, other trainer: fine
  ASSERT_THAT(c.AddRange(0, 1, 0, 2), IsOk());
  EXPECT_THAT(c.CheckTrainerComplete(0), IsOk());
  EXPECT_THAT(c.CheckTrainerComplete(1),
              StatusIs(absl::StatusCode::kInvalidArgument, "param 'b': gradient elements [0, 2) of 2 missing from trainer 1"));
}

TEST(StepContributionsTest, DropTrainerForgetsItsRangesAndCommit) {
  StepContributions c(GradientMode::kSharded, 2, {10}, &kNames);
  ASSERT_THAT(c.AddRange(0, 0, 0, 5), IsOk());
  ASSERT_THAT(c.AddRange(1, 0, 5, 5), IsOk());
  c.Commit(0);
  c.Commit(1);
  EXPECT_TRUE(c.all_committed());
  c.DropTrainer(1);
  EXPECT_FALSE(c.all_committed());
  EXPECT_FALSE(c.committed(1));
  EXPECT_TRUE(c.committed(0));
  EXPECT_EQ(c.elements_from(1), 0);
  EXPECT_THAT(c.AddRange(1, 0, 5, 5), IsOk());  // may resend the same range
  c.Reset();
  EXPECT_FALSE(c.started());
  EXPECT_FALSE(c.committed(0));
}

}  // namespace
// REPLICATED: a trainer that begins again keeps what it sent (it is in the sum already); its
// resent elements are skipped, the rest is fresh, whatever the new chunking.
TEST(StepContributionsTest, ReplicatedResendSkipsWhatWasCarriedOver) {
  StepContributions c(GradientMode::kReplicated, 2, {10}, &kNames);
  std::vector<ElementRange> fresh;
  ASSERT_THAT(c.AddRange(1, 0, 0, 3, &fresh), IsOk());
  ASSERT_THAT(c.AddRange(1, 0, 6, 2, &fresh), IsOk());
  EXPECT_EQ(fresh, (std::vector<ElementRange>{{0, 3}, {6, 8}}));
  c.DropTrainer(1);
  EXPECT_EQ(c.elements_from(1), 0);
  // The resend chunks differently: [2, 7) covers the tail of one carried range, a gap, and the
  // head of another.
  fresh.clear();
  ASSERT_THAT(c.AddRange(1, 0, 2, 5, &fresh), IsOk());
  EXPECT_EQ(fresh, (std::vector<ElementRange>{{3, 6}}));
  // Within the attempt, overlaps are errors again, carried parts are not.
  EXPECT_THAT(c.AddRange(1, 0, 4, 1), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "chunk [4, 5) from trainer 1 overlaps chunk"));
  fresh.clear();
  ASSERT_THAT(c.AddRange(1, 0, 0, 2, &fresh), IsOk());
  EXPECT_TRUE(fresh.empty());
  fresh.clear();
  ASSERT_THAT(c.AddRange(1, 0, 7, 3, &fresh), IsOk());
  EXPECT_EQ(fresh, (std::vector<ElementRange>{{8, 10}}));
  EXPECT_EQ(c.elements_from(1), 10);
  EXPECT_THAT(c.CheckTrainerComplete(1), IsOk());
  // SHARDED forgets instead: the same range is fresh again.
  StepContributions sharded(GradientMode::kSharded, 1, {4}, &kNames);
  ASSERT_THAT(sharded.AddRange(0, 0, 0, 4), IsOk());
  sharded.DropTrainer(0);
  fresh.clear();
  ASSERT_THAT(sharded.AddRange(0, 0, 0, 4, &fresh), IsOk());
  EXPECT_EQ(fresh, (std::vector<ElementRange>{{0, 4}}));
}

// One-element chunks would make a record of each element, in both modes (REPLICATED: carried
// over to the trainer's later attempts). Each trainer's pieces of a step are bounded; another
// trainer's are its own, and the next step starts afresh.
TEST(StepContributionsTest, ATrainersPiecesOfAStepAreBounded) {
  constexpr int64_t kNumel = 4 * StepContributions::kMinPieceElements;
  for (GradientMode mode : {GradientMode::kReplicated, GradientMode::kSharded}) {
    SCOPED_TRACE(mode == GradientMode::kSharded ? "sharded" : "replicated");
    StepContributions c(mode, 2, {kNumel, 4}, &kNames);
    EXPECT_EQ(c.max_ranges(), 2 + 4 + StepContributions::kSpareRanges);
    int64_t taken = 0;
    absl::Status added;
    for (int64_t element = 0; element < kNumel && added.ok(); element += 2) {
      added = c.AddRange(0, 0, element, 1);  // odd elements left out: no two pieces touch
      if (added.ok()) ++taken;
    }
    EXPECT_THAT(added, StatusIs(absl::StatusCode::kResourceExhausted, "from trainer 0"));
    EXPECT_EQ(taken, c.max_ranges());
    EXPECT_THAT(c.AddRange(1, 1, 0, 4), IsOk());
    c.Reset();
    EXPECT_THAT(c.AddRange(0, 0, 0, kNumel), IsOk());
  }
}

}  // namespace optstep
