// Initial values (InitParameters) under state redundancy (docs/design.md, "State redundancy"):
// the shadows start from them, a rank lost before step 1 takes them back, and none is taken once
// step 1 was applied to a rank's own parameters or shadow before a lost peer interrupted it (the
// redo skips the updates applied, and would keep the values), nor while the group heals. Ranks
// are engines in this process joined by gloo (RedundancyGroup).

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::Difference;
using ::optstep::testutil::ExpectSameState;
using ::optstep::testutil::HealRankOne;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::RedundancyGroup;
using ::optstep::testutil::StatusIs;

// Sets every master to values that are not zero, as InitParameters does: under OWNERS storage on
// its owner alone (the others would keep none of them), under REPLICATED on every rank.
void InitValues(RedundancyGroup& group) {
  const SessionConfig& config = group.session(0).config();
  for (size_t p = 0; p < config.params.size(); ++p) {
    std::vector<float> values(config.params[p].numel());
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f + 0.01f * ((i * 7 + p) % 13);
    for (int r = 0; r < group.world(); ++r) {
      if (config.storage == ParameterStorage::kOwners && group.session(r).layout().owner[p] != r) {
        continue;
      }
      OPTSTEP_ASSERT_OK(group.session(r).InitValues(static_cast<int>(p), 0, DType::kF32,
                                                    values.data(), values.size() * 4));
    }
  }
}

class InitialValuesTest : public testing::TestWithParam<ParameterStorage> {};

// The initial values reach the replicas only; the shadows start from them all the same (step 1
// ships each rank's owned masters to its buddy first): after step 1 every shadow equals its
// owner's state, and rank 1 lost in step 2 (before the step's last collective, after every update)
// takes back its own masters from its buddy and ends as an undisturbed run.
TEST_P(InitialValuesTest, ShadowsStartFromTheInitialValuesAndAHealedRankKeepsThem) {
  SessionConfig config = ConfigOf("adamw");
  config.storage = GetParam();
  const char* last = GetParam() == ParameterStorage::kOwners ? "Barrier" : "AllGatherV";
  RedundancyGroup reference(3, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(reference));
  for (uint64_t step = 1; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(3, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(group));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("owner ", r));
    EXPECT_EQ(Difference(group.OwnedState(r), group.Shadow((r + 1) % 3)), "");
  }
  group.comm(1).faults().FailCall(last, group.comm(1).faults().calls(last) + 1,
                                  absl::UnavailableError("injected: rank 1 dies"));
  group.Step(2);
  EXPECT_EQ(group.session(0).interrupted_step(), std::optional<uint64_t>(2));
  EXPECT_EQ(group.session(2).interrupted_step(), std::optional<uint64_t>(2));
  ASSERT_NO_FATAL_FAILURE(HealRankOne(group));
  for (uint64_t step = 2; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

// Rank 1 lost before step 1, after its initial values were set (REPLICATED storage: every rank
// had them, and its buddy wrote them into its shadow): the healed rank takes them back and the
// run ends as an undisturbed one. Before, it took back the shadow's zeros as its masters. (Under
// OWNERS storage only rank 1 had them: docs/design.md, "State redundancy".)
TEST(InitialValuesBeforeStepOneTest, ARankLostBeforeStepOneTakesItsInitialValuesBack) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(3, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(reference));
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));
  RedundancyGroup group(3, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(group));
  ASSERT_NO_FATAL_FAILURE(HealRankOne(group));
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

INSTANTIATE_TEST_SUITE_P(Storage, InitialValuesTest,
                         testing::Values(ParameterStorage::kReplicated, ParameterStorage::kOwners),
                         [](const testing::TestParamInfo<ParameterStorage>& info) {
                           return info.param == ParameterStorage::kOwners ? "Owners" : "Replicated";
                         });

// Other initial values of parameter 0 on rank r (answers whether they were taken).
absl::Status InitAgain(RedundancyGroup& group, int r) {
  std::vector<float> values(group.session(r).config().params[0].numel(), 9.0f);
  return group.session(r).InitValues(0, 0, DType::kF32, values.data(), values.size() * 4);
}

// Step 1 cut after both ranks stepped their own parameters and shadows: initial values are
// refused while the step waits for the heal, and after it, and the run ends as an undisturbed
// one. Before, they were taken (the counters were still at 0) and the redo, which skips the
// updates applied already, kept them: step 1 was lost without an error.
TEST(InitialValuesAfterALossTest, AreRefusedOnceStepOneWasAppliedHere) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(2, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(reference));
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(InitValues(group));
  group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                  absl::UnavailableError("injected: peer lost"));
  group.Step(1);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(group.session(r).interrupted_step(), std::optional<uint64_t>(1)) << "rank " << r;
    EXPECT_THAT(InitAgain(group, r),
                StatusIs(absl::StatusCode::kFailedPrecondition, "applied step 1"))
        << "rank " << r;
  }
  group.Regroup();
  for (int r = 0; r < 2; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(InitAgain(group, r),
                StatusIs(absl::StatusCode::kFailedPrecondition, "applied step 1"))
        << "rank " << r;
  }
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

// Before step 1, rank 1's shadow is fetched again (a heal's refresh) while a trainer sets initial
// values, which write the shadow too: they are refused until the refresh is written, and the
// shadow ends as its owner's state. Before, both wrote the shadow at once.
TEST(InitialValuesAfterALossTest, AreRefusedWhileTheShadowIsWritten) {
  RedundancyGroup group(2, ConfigOf("adamw"));
  const StateDict owner = group.OwnedState(0);
  testutil::FaultInjector& faults = group.device_faults(1);
  const int64_t base = faults.calls("CopyFromHost");
  faults.DelayCalls("CopyFromHost", base + 1, base + 1, absl::Seconds(1));
  struct Refresh {  // outlives this test's frame, whatever it asserts
    absl::Notification done;
    absl::Status status = absl::UnknownError("not done");
  };
  auto refresh = std::make_shared<Refresh>();
  group.session(1).ImportShadow(std::make_shared<const StateDict>(owner),
                                [refresh](absl::Status s) {
                                  refresh->status = s;
                                  refresh->done.Notify();
                                });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (faults.calls("CopyFromHost") == base && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(faults.calls("CopyFromHost"), base + 1);
  EXPECT_THAT(InitAgain(group, 1),
              StatusIs(absl::StatusCode::kUnavailable, "writes state imported from a peer"));
  refresh->done.WaitForNotification();
  EXPECT_THAT(refresh->status, IsOk());
  EXPECT_EQ(Difference(group.Shadow(1), owner), "");
  EXPECT_THAT(InitAgain(group, 1), IsOk());
}

// Initial values while a checkpoint or state dict operation holds the session (a Save reads
// the masters, a Load writes them, the last outside any step): refused until the hold ends.
// Before, they were written meanwhile, half in the checkpoint or under the state loaded.
TEST(InitialValuesAfterALossTest, AreRefusedWhileACheckpointHoldsTheSession) {
  RedundancyGroup group(2, ConfigOf("adamw"));
  Session& s = group.session(1);
  ASSERT_THAT(s.holds().Hold(7, absl::Seconds(30)).status(), IsOk());
  EXPECT_THAT(InitAgain(group, 1),
              StatusIs(absl::StatusCode::kUnavailable, "a checkpoint or state dict operation"));
  // As a stream's first piece: the stream ends there, rather than stage every value first.
  const float value = 1.0f;
  EXPECT_THAT(s.CheckInitPiece(
                   {0, 0, DType::kF32, absl::string_view(reinterpret_cast<const char*>(&value), 4)})
                  .status(),
              StatusIs(absl::StatusCode::kUnavailable, "a checkpoint or state dict operation"));
  OPTSTEP_ASSERT_OK(s.holds().Release(7));
  EXPECT_THAT(InitAgain(group, 1), IsOk());
}

// A pull of rank `r`'s parameters in fp32 (GetSnapshot), made at once; answered through the
// result's `done`.
struct Pull {
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> snapshot = absl::UnknownError("not pulled");
};
std::shared_ptr<Pull> StartPull(RedundancyGroup& group, int r) {
  auto pull = std::make_shared<Pull>();  // outlives the test's frame, whatever it asserts
  group.session(r).GetSnapshot(DType::kF32,
                               [pull](absl::StatusOr<std::shared_ptr<const ParamSnapshot>> s) {
                                 pull->snapshot = std::move(s);
                                 pull->done.Notify();
                               });
  return pull;
}

// Parameter `p`'s values in a pull.
std::vector<float> PulledValues(const Pull& pull, int p) {
  const std::string& values = (*pull.snapshot)->values[p];
  std::vector<float> got(values.size() / sizeof(float));
  std::memcpy(got.data(), values.data(), values.size());
  return got;
}

// Initial values sent while a pull copies the parameters (before step 1, a slice at a time) are
// written on the coordinator after the copy, as a step's update would be: the pull answers every
// value from before them, and the next pull every value as written. Here parameter 0's values
// are sent once it was copied, while the copy of parameter 1 is slowed. (Written from the call's
// thread, they went into the masters during the copy, which had to be made again.)
TEST(InitialValuesAfterALossTest, APullTheyMeetHoldsTheValuesFromBeforeThem) {
  RedundancyGroup group(2, ConfigOf("adamw"));
  testutil::FaultInjector& faults = group.device_faults(0);
  const int64_t base = faults.calls("CopyToHost");
  faults.DelayCalls("CopyToHost", base + 2, base + 2, absl::Seconds(1));
  std::shared_ptr<Pull> pull = StartPull(group, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (faults.calls("CopyToHost") < base + 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(faults.calls("CopyToHost"), base + 2);
  EXPECT_THAT(InitAgain(group, 0), IsOk());
  ASSERT_TRUE(pull->done.HasBeenNotified()) << "the values were written before the pull's copy";
  ASSERT_THAT(pull->snapshot.status(), IsOk());
  const std::vector<float> before = PulledValues(*pull, 0);
  EXPECT_EQ(before, std::vector<float>(before.size(), 0.0f)) << "parameter 0 from after its values";

  std::shared_ptr<Pull> next = StartPull(group, 0);
  next->done.WaitForNotification();
  ASSERT_THAT(next->snapshot.status(), IsOk());
  const std::vector<float> after = PulledValues(*next, 0);
  EXPECT_EQ(after, std::vector<float>(after.size(), 9.0f));
}

}  // namespace
}  // namespace optstep
