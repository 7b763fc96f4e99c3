// State redundancy (docs/design.md, "State redundancy"): each rank's shadow of its predecessor
// equals that rank's own state bit for bit after steps of AdamW, Muon and SOAP; a step
// interrupted by a lost peer is redone after the heal and applied exactly once, whether the ranks
// had applied it or not; a rank lost and restarted gets its state from its buddy, its shadow
// from its predecessor and the masters from a peer, and the run ends bit for bit as an
// undisturbed one. Initial values under state redundancy: initial_values_test.cc. A rank whose
// last collective failed where another's completed takes the step from it: catch_up_test.cc.
// Ranks are engines in this process joined by gloo.

#include <algorithm>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/engine/gradient_shipment.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::Difference;
using ::optstep::testutil::ExpectSameState;
using ::optstep::testutil::FaultInjector;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::RedundancyGroup;
using ::optstep::testutil::StatusIs;

ParamInfo Param(const std::string& name, Shape shape) { return ParamInfo{name, std::move(shape)}; }

struct Case {
  std::string kind;
  int world;
};

class ShadowTest : public testing::TestWithParam<Case> {};

TEST_P(ShadowTest, ShadowEqualsItsOwnersStateBitForBit) {
  RedundancyGroup group(GetParam().world, ConfigOf(GetParam().kind));
  const StateDict before = group.OwnedState(0);
  for (uint64_t step = 1; step <= 4; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ASSERT_NE(Difference(group.OwnedState(0), before), "") << "the steps changed nothing";
  for (int r = 0; r < group.world(); ++r) {
    SCOPED_TRACE(absl::StrCat("owner ", r));
    const StateDict own = group.OwnedState(r);
    const StateDict shadow = group.Shadow((r + 1) % group.world());
    EXPECT_EQ(Difference(own, shadow), "");
    ASSERT_EQ(own.count("meta/step"), 1u);
    EXPECT_EQ(own.at("meta/step").bytes, shadow.at("meta/step").bytes);
    EXPECT_GT(own.size(), 3u);  // masters and state, not only counters
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShadowTest,
                         testing::Values(Case{"adamw", 2}, Case{"muon", 2}, Case{"soap", 2},
                                         Case{"adamw", 3}, Case{"muon", 3}, Case{"soap", 3}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.kind, "_", info.param.world, "ranks");
                         });

// Rank 1 fails `method` in step 2: every rank is interrupted at step 2 (not broken) and refuses
// steps; after the heal the step is redone and the run ends as an undisturbed one.
void InterruptAndRedo(const char* method) {
  const SessionConfig config = ConfigOf("muon");
  RedundancyGroup reference(2, config);
  for (uint64_t step = 1; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  group.comm(1).faults().FailCall(method, group.comm(1).faults().calls(method) + 1,
                                  absl::UnavailableError("injected: peer lost"));
  for (const absl::StatusOr<StepOutcome>& outcome : group.Step(2)) {
    EXPECT_THAT(outcome.status(), StatusIs(absl::StatusCode::kUnavailable));
  }
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(group.session(r).interrupted_step(), std::optional<uint64_t>(2));
    EXPECT_FALSE(group.session(r).healthy());  // not serving until the heal
    // Read at one moment: interrupted, not lost (the watch of the rank's groups waits for it).
    const Session::Health health = group.session(r).health();
    EXPECT_FALSE(health.broken);
    EXPECT_EQ(health.interrupted, std::optional<uint64_t>(2));
    StepBegin begin;
    begin.step = 2;
    EXPECT_THAT(group.session(r).Begin(begin).status(),
                StatusIs(absl::StatusCode::kUnavailable, "once the group heals"));
  }
  group.Regroup();
  for (int r = 0; r < 2; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(group.session(r).healthy());
    EXPECT_TRUE(group.session(r).health().healthy());
  }
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(3));
  ExpectSameState(group, reference);
}

TEST(StateRedundancyTest, StepInterruptedAfterTheUpdateIsNotAppliedTwice) {
  InterruptAndRedo("AllGatherV");  // both ranks had stepped their parameters
}

TEST(StateRedundancyTest, StepInterruptedBeforeTheUpdateIsApplied) {
  InterruptAndRedo("AllReduce");  // the agreement failed: nothing stepped
}

// Steps `world` ranks of `config` up to step `cut` - 1, injects `fault` into their
// communicators, and takes step `cut`: every rank must answer UNAVAILABLE and be interrupted at
// it; healed in place, the group's steps `cut` and `cut` + 1 must end as an undisturbed run's.
void CutStepAndRedo(int world, const SessionConfig& config, uint64_t cut,
                    const std::function<void(RedundancyGroup&)>& fault) {
  RedundancyGroup reference(world, config);
  for (uint64_t step = 1; step <= cut + 1; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(world, config);
  for (uint64_t step = 1; step < cut; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  fault(group);
  for (const absl::StatusOr<StepOutcome>& outcome : group.Step(cut)) {
    EXPECT_THAT(outcome.status(), StatusIs(absl::StatusCode::kUnavailable));
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(group.session(r).interrupted_step(), std::optional<uint64_t>(cut)) << "rank " << r;
  }
  group.Regroup();
  for (int r = 0; r < world; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
  for (uint64_t step = cut; step <= cut + 1; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

void CutStepTwoAndRedo(int world, const SessionConfig& config,
                       const std::function<void(RedundancyGroup&)>& fault) {
  CutStepAndRedo(world, config, 2, fault);
}

// Step 1 ships each owner's initial masters into its buddy's shadow before the update; its
// shipment of the gradients is then cut (the buddy lost), after the owners stepped their own.
// The redo must seed the shadows with the initial masters again, not with the owners' masters of
// after step 1, which the shadows' update would step a second time.
TEST(StateRedundancyTest, AStepOneCutAfterTheUpdateSeedsTheShadowsOnce) {
  CutStepAndRedo(2, ConfigOf("adamw"), 1, [](RedundancyGroup& group) {
    FaultInjector& faults = group.comm(1).faults();
    faults.FailCall("RingShift", faults.calls("RingShift") + 2,
                    absl::UnavailableError("injected: the buddy is lost"));
  });
}

// Step 1 cut in the all-gather, after every shipment ended: every shadow took step 1 already,
// and drops the redo's seed (the owners' initial masters) rather than take it under its state
// of after step 1.
TEST(StateRedundancyTest, AStepOneCutInTheAllGatherKeepsTheShadowsItStepped) {
  CutStepAndRedo(2, ConfigOf("adamw"), 1, [](RedundancyGroup& group) {
    FaultInjector& faults = group.comm(1).faults();
    faults.FailCall("AllGatherV", faults.calls("AllGatherV") + 1,
                    absl::UnavailableError("injected: peer lost"));
  });
}

// The same on three ranks under OWNERS storage (the shadow holds the masters' only other copy),
// the cut on one rank's shipment alone.
TEST(StateRedundancyTest, AStepOneCutOnOneRankSeedsEveryShadowOnceUnderOwners) {
  SessionConfig config = ConfigOf("muon");
  config.storage = ParameterStorage::kOwners;
  CutStepAndRedo(3, config, 1, [](RedundancyGroup& group) {
    FaultInjector& faults = group.comm(2).faults();
    faults.FailCall("RingShift", faults.calls("RingShift") + 2,
                    absl::UnavailableError("injected: the buddy is lost"));
  });
}

// Each rank owns a small vector, stepped first (the AdamW group comes first in the chain), and a
// matrix above GradientShipment::kRoundElements, whose gradients go to the buddy in a second
// round. Rank 0's second round of step 2 fails (its buddy is lost) while its update waits for
// it, the vector already stepped: the step is interrupted and redone after the heal, and the
// vector's update must be applied once, not again by the redo.
TEST(StateRedundancyTest, AShipmentCutInItsSecondRoundAppliesEachUpdateOnce) {
  SessionConfig config = ConfigOf("adamw");
  const int64_t rows = GradientShipment::kRoundElements / 1024 + 64;  // past one round
  config.params = {Param("a", {256}), Param("b", {256}), Param("w0", {rows, 1024}),
                   Param("w1", {rows, 1024})};
  std::swap(config.chain.sub_optimizers[0], config.chain.sub_optimizers[1]);  // vectors first
  CutStepTwoAndRedo(2, config, [](RedundancyGroup& group) {
    FaultInjector& faults = group.comm(0).faults();
    faults.FailCall("RingShift", faults.calls("RingShift") + 2,
                    absl::UnavailableError("injected: the buddy is lost"));
  });
}

// Rank 0's update fails on its device in step 2 while its shipment fails too (its buddy is
// lost): part of the update may be applied, so rank 0 is broken, not interrupted, where a redo
// after the heal would apply that part again. Rank 1 only lost its peer: interrupted.
TEST(StateRedundancyTest, AnUpdateFailedOnTheDeviceBreaksTheRankThoughAPeerIsLostToo) {
  RedundancyGroup group(2, ConfigOf("adamw"));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  // Step 1's shadow update runs after the step, on rank 0's device too: an export queued behind
  // it on the coordinator waits it out, so that the fault below hits step 2's own update.
  (void)group.Shadow(0);
  FaultInjector& comm = group.comm(0).faults();
  comm.FailCall("RingShift", comm.calls("RingShift") + 1,
                absl::UnavailableError("injected: the buddy is lost"));
  FaultInjector& device = group.device_faults(0);
  device.FailCall("AdamW", device.calls("AdamW") + 1,
                  absl::InternalError("injected: the device fails"));
  const std::vector<absl::StatusOr<StepOutcome>> outcomes = group.Step(2);
  EXPECT_THAT(outcomes[0].status(), StatusIs(absl::StatusCode::kInternal, "the device fails"));
  EXPECT_THAT(outcomes[1].status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(group.session(0).interrupted_step(), std::nullopt);
  EXPECT_FALSE(group.session(0).healthy());
  EXPECT_EQ(group.session(1).interrupted_step(), std::optional<uint64_t>(2));
}

// What a rank holds counts its shadow: the predecessor's owned masters, AdamW moments and
// gradient buffers, 16 bytes an element; nothing without redundancy.
TEST(StateRedundancyTest, TheStatsCountTheShadow) {
  const SessionConfig config = ConfigOf("adamw");
  for (bool redundancy : {true, false}) {
    SCOPED_TRACE(redundancy ? "with redundancy" : "without");
    RedundancyGroup group(2, config, redundancy);
    ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
    for (int r = 0; r < 2; ++r) {
      const int predecessor = 1 - r;
      int64_t owned = 0;
      for (size_t p = 0; p < config.params.size(); ++p) {
        if (group.session(r).layout().owner[p] == predecessor) owned += config.params[p].numel();
      }
      ASSERT_GT(owned, 0);
      EXPECT_EQ(group.session(r).stats().shadow_bytes, redundancy ? 16 * owned : 0) << r;
    }
  }
}

TEST(StateRedundancyTest, WithoutRedundancyALostPeerBreaksTheSession) {
  RedundancyGroup group(2, ConfigOf("adamw"), /*redundancy=*/false);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                  absl::UnavailableError("injected: peer lost"));
  group.Step(2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(group.session(r).healthy());
    EXPECT_EQ(group.session(r).interrupted_step(), std::nullopt);
  }
}

// Rank 1 of 3 is lost (between steps, or in step 3's all-gather after its update) and restarted:
// it gets the masters from rank 0, its own state from its buddy (rank 2) and its shadow of rank
// 0 from rank 0; the run goes on and ends as an undisturbed one.
void LoseAndHealRankOne(bool mid_step) {
  const SessionConfig config = ConfigOf("soap");
  RedundancyGroup reference(3, config);
  for (uint64_t step = 1; step <= 4; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(3, config);
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  if (mid_step) {
    group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                    absl::UnavailableError("injected: rank 1 dies"));
    group.Step(3);
    EXPECT_EQ(group.session(0).interrupted_step(), std::optional<uint64_t>(3));
    EXPECT_EQ(group.session(2).interrupted_step(), std::optional<uint64_t>(3));
  }
  ASSERT_NO_FATAL_FAILURE(testutil::HealRankOne(group));
  for (uint64_t step = 3; step <= 4; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

TEST(StateRedundancyTest, RankLostBetweenStepsIsHealedFromItsBuddy) { LoseAndHealRankOne(false); }

TEST(StateRedundancyTest, RankLostAfterItsUpdateIsHealedAndTheStepRedone) {
  LoseAndHealRankOne(true);
}

// What rank r answers a heal that asks for its shadow (Session::ExportShadow).
absl::Status ShadowExport(RedundancyGroup& group, int r) {
  absl::Notification done;
  absl::Status shadow;
  group.session(r).ExportShadow([&](absl::StatusOr<std::shared_ptr<const StateDict>> s) {
    shadow = s.status();
    done.Notify();
  });
  done.WaitForNotification();
  return shadow;
}

TEST(StateRedundancyTest, AnImportedStateIsSteppedAgainAndMakesTheShadowStale) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(2, config);
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  const StateDict at_one[2] = {group.HeldExport(0), group.HeldExport(1)};
  for (uint64_t step = 2; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  // Back to step 1 on every rank: step 2 is applied again (its owned update included).
  for (int r = 0; r < 2; ++r) OPTSTEP_ASSERT_OK(group.HeldImport(r, at_one[r]));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_EQ(Difference(group.Masters(r), reference.Masters(r)), "");
    EXPECT_EQ(Difference(group.OwnedState(r), reference.OwnedState(r)), "");
    // The predecessor's state was replaced on its rank: the shadow is not served any more.
    EXPECT_THAT(ShadowExport(group, r), StatusIs(absl::StatusCode::kFailedPrecondition, "stale"));
  }
}

// OWNERS storage on 4 ranks: rank 2 fails the shipping of the gradients around the ring, so its
// neighbours (1, 3) fail theirs, while rank 0, which exchanges with 1 and 3 only, steps on. With
// no all-gather after the ring, rank 0 would end step 2 alone and the redone step would wait for
// it in vain; the barrier after the shipment interrupts it with the others instead, and
// the step redone on every rank ends as an undisturbed run.
TEST(StateRedundancyTest, UnderOwnersStorageALossInTheRingInterruptsTheStepOnEveryRank) {
  SessionConfig config = ConfigOf("adamw");
  config.storage = ParameterStorage::kOwners;
  CutStepTwoAndRedo(4, config, [](RedundancyGroup& group) {
    FaultInjector& faults = group.comm(2).faults();
    faults.FailCall("RingShift", faults.calls("RingShift") + 1,
                    absl::UnavailableError("injected: rank 2 dies"));
  });
}

// The fp32 parameters rank r of `group` answers a pull (Session::GetSnapshot).
absl::StatusOr<std::shared_ptr<const ParamSnapshot>> Pull(RedundancyGroup& group, int r) {
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> pulled;
  group.session(r).GetSnapshot(DType::kF32, [&](auto s) {
    pulled = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return pulled;
}

// A pull on rank 0 during step 2 (asked once the result is agreed, as a trainer's streamed step
// goes on, after the rank released step 1's snapshot), which a lost rank then interrupts after
// the update: the pull must not answer the half-applied masters (rank 0's own parameters
// stepped, the others not gathered) as step 1's, nor may one after the heal before the redo.
TEST(StateRedundancyTest, APullDuringAnInterruptedStepIsNotAnsweredHalfApplied) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> at_one = Pull(group, 0);
  ASSERT_THAT(at_one.status(), IsOk());
  ASSERT_EQ((*at_one)->step, 1u);

  group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                  absl::UnavailableError("injected: peer lost"));
  absl::Notification pulled;
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> during = absl::UnknownError("not pulled");
  absl::Notification answered[2];
  for (int r = 0; r < 2; ++r) {
    Session& s = group.session(r);
    StepBegin begin;
    begin.step = 2;
    begin.return_params = r == 0;
    begin.stream_params = r == 0;
    absl::StatusOr<StepHandle> c = s.Begin(begin);
    ASSERT_THAT(c.status(), IsOk());
    for (int p = 0; p < static_cast<int>(config.params.size()); ++p) {
      if (s.layout().owner[p] != r) continue;
      std::vector<float> grad(config.params[p].numel());
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = RedundancyGroup::Gradient(2, p, i);
      ASSERT_THAT(s.AddGradient(*c, p, 0, DType::kF32, grad.data(), grad.size() * 4), IsOk());
    }
    ASSERT_THAT(s.Commit(*c, 0,
                         [&, r](absl::StatusOr<StepOutcome> o) {
                           if (r == 0 && o.ok()) {
                             group.session(0).GetSnapshot(DType::kF32, [&](auto snapshot) {
                               during = std::move(snapshot);
                               pulled.Notify();
                             });
                           }
                           answered[r].Notify();
                         }),
                IsOk());
  }
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(answered[r].WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(pulled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_EQ(group.session(0).interrupted_step(), std::optional<uint64_t>(2));
  // Refused (the step is taken again once the group heals), or step 1's parameters.
  if (during.ok()) {
    EXPECT_EQ((*during)->step, 1u);
    for (size_t p = 0; p < config.params.size(); ++p) {
      EXPECT_TRUE((*during)->values[p] == (*at_one)->values[p])
          << "param " << config.params[p].name << " (owner " << group.session(0).layout().owner[p]
          << ") is not step 1's";
    }
  }
  // Healed, the step not yet redone: the masters are still ahead of step 1. Redone: step 2's.
  group.Regroup();
  for (int r = 0; r < 2; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> healed = Pull(group, 0);
  if (healed.ok()) {
    EXPECT_EQ((*healed)->values, (*at_one)->values);
  }
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> at_two = Pull(group, 0);
  ASSERT_THAT(at_two.status(), IsOk());
  EXPECT_EQ((*at_two)->step, 2u);
}

// Steps 1 and 2 on every rank of `group`, each rank's shipment to its buddy cut in step 2: its
// own parameters take the step, its shadow does not. `reference` takes both undisturbed.
void StepTwoWithEveryShipmentCut(RedundancyGroup& group, RedundancyGroup& reference) {
  ASSERT_NO_FATAL_FAILURE(reference.StepOk(1));
  ASSERT_NO_FATAL_FAILURE(reference.StepOk(2));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  for (int r = 0; r < group.world(); ++r) {
    FaultInjector& faults = group.comm(r).faults();
    faults.FailCall("RingShift", faults.calls("RingShift") + 1,
                    absl::UnavailableError("injected: the buddy is lost"));
  }
  group.Step(2);
}

// Rank r restarted and healed into `generation` as TakeStateFromPeers does: the masters of rank
// `any`, its own state from its buddy's shadow, its shadow from its predecessor's own state.
void HealRestarted(RedundancyGroup& group, int r, int any, uint64_t generation) {
  const int world = group.world();
  const StateDict masters = group.Masters(any);
  const StateDict own_state = group.Shadow((r + 1) % world);
  const StateDict shadow = group.OwnedState((r + world - 1) % world);
  group.Regroup(/*replaced=*/r);
  ASSERT_THAT(group.ImportMasters(r, masters), IsOk());
  ASSERT_THAT(group.ImportOwnedState(r, own_state), IsOk());
  ASSERT_THAT(group.ImportShadow(r, shadow), IsOk());
  for (int q = 0; q < world; ++q) group.session(q).ResumeAfterHeal(generation);
}

// Step 2 cut in the shipments, and rank 0 lost. Restarted, rank 0 heals in with the masters of
// rank 1, whose own took step 2, and its own state from rank 1's shadow (step 1). Until the redo
// it must not answer those masters as step 1's; the redo then ends bit for bit as an undisturbed
// step 2. Before, a pull on it answered rank 1's parameters of step 2 labelled step 1 (every pull
// goes to rank 0 under REPLICATED storage).
TEST(StateRedundancyTest, ARankHealedFromMastersAheadDoesNotAnswerThemBeforeTheRedo) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(2, config), group(2, config);
  ASSERT_NO_FATAL_FAILURE(StepTwoWithEveryShipmentCut(group, reference));
  ASSERT_NO_FATAL_FAILURE(HealRestarted(group, 0, 1, 1));
  EXPECT_THAT(Pull(group, 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, "once the step is taken again"));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  absl::StatusOr<std::shared_ptr<const ParamSnapshot>> at_two = Pull(group, 0);
  ASSERT_THAT(at_two.status(), IsOk());
  EXPECT_EQ((*at_two)->step, 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(Difference(group.Masters(r), reference.Masters(r)), "") << "rank " << r;
    EXPECT_EQ(Difference(group.OwnedState(r), reference.OwnedState(r)), "") << "rank " << r;
  }
}

// The same, then a part of rank 0's state imported before the redo (ImportStateDict of some keys:
// one moment): the masters the import did not write are still rank 1's of step 2, and no pull
// answers them as step 1's. Before, any import cleared the mark. A whole state imported clears it.
TEST(StateRedundancyTest, AnImportOfAPartOfTheStateKeepsTheMarkOfMastersAhead) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(2, config), group(2, config);
  ASSERT_NO_FATAL_FAILURE(StepTwoWithEveryShipmentCut(group, reference));
  ASSERT_NO_FATAL_FAILURE(HealRestarted(group, 0, 1, 1));
  const StateDict owned = reference.OwnedState(0);
  const auto moment = std::find_if(owned.begin(), owned.end(), [](const auto& entry) {
    return absl::StartsWith(entry.first, "state/");
  });
  ASSERT_NE(moment, owned.end());
  ASSERT_THAT(group.HeldImport(0, StateDict{*moment}, /*complete=*/false), IsOk());
  EXPECT_THAT(Pull(group, 0).status(),
              StatusIs(absl::StatusCode::kUnavailable, "once the step is taken again"));
  StateDict masters = group.Masters(0);
  for (auto it = masters.begin(); it != masters.end();) {
    it = absl::StartsWith(it->first, "meta/") ? masters.erase(it) : std::next(it);
  }
  ASSERT_THAT(group.HeldImport(0, masters, /*complete=*/false), IsOk());
  EXPECT_THAT(Pull(group, 0).status(), IsOk());
}

// The same on three ranks, then rank 1 lost too before the redo: it heals from rank 0, whose own
// masters are step 1's (from rank 1's shadow) but which holds rank 2's of step 2, and takes its
// own state from rank 2's shadow (step 1). Rank 0 passes the mark on; before, it sent only its
// own parameters' step, and rank 1 answered rank 2's parameters of step 2 as step 1's.
TEST(StateRedundancyTest, AMarkOfMastersAheadIsPassedOnByTheRankHealedWithThem) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(3, config), group(3, config);
  ASSERT_NO_FATAL_FAILURE(StepTwoWithEveryShipmentCut(group, reference));
  ASSERT_NO_FATAL_FAILURE(HealRestarted(group, 0, 1, 1));
  ASSERT_NO_FATAL_FAILURE(HealRestarted(group, 1, 0, 2));
  EXPECT_THAT(Pull(group, 1).status(),
              StatusIs(absl::StatusCode::kUnavailable, "once the step is taken again"));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(Difference(group.Masters(r), reference.Masters(r)), "") << "rank " << r;
    EXPECT_EQ(Difference(group.OwnedState(r), reference.OwnedState(r)), "") << "rank " << r;
  }
}

// Step 2 cut after both ranks stepped their own parameters, the group healed, the step not yet
// redone: a held export (a save, an automatic checkpoint, a state dict) is refused UNAVAILABLE
// until the redo. Before, it answered the masters and moments of step 2 with step 1's counters:
// restored, that checkpoint had step 2 applied twice.
TEST(StateRedundancyTest, AHeldExportBetweenTheHealAndTheRedoIsRefused) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  const StateDict at_one = group.HeldExport(0);
  group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                  absl::UnavailableError("injected: peer lost"));
  group.Step(2);
  group.Regroup();
  for (int r = 0; r < 2; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(group.TryHeldExport(r).status(),
                StatusIs(absl::StatusCode::kUnavailable, "once the step is taken again"))
        << "rank " << r;
  }
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const StateDict at_two, group.TryHeldExport(0));
  EXPECT_NE(Difference(at_two, at_one), "");
}

// Step 2 cut after both ranks stepped their own parameters, the group healed: a redo that brings
// other gradient bytes than the ones committed before the loss is refused, since the ranks (and
// shadows) that applied the step keep it and the others would apply the redo's. The same bytes
// are then taken, and the run ends as an undisturbed one. Before, the other bytes were taken.
TEST(StateRedundancyTest, ARedoOfAnInterruptedStepMustBringTheSameContribution) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup reference(2, config);
  for (uint64_t step = 1; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));
  testutil::Outcome outcome;  // outlives the group: told when the session ends, if taken
  RedundancyGroup group(2, config);
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  group.comm(1).faults().FailCall("AllGatherV", group.comm(1).faults().calls("AllGatherV") + 1,
                                  absl::UnavailableError("injected: peer lost"));
  group.Step(2);
  group.Regroup();
  for (int r = 0; r < 2; ++r) group.session(r).ResumeAfterHeal(/*generation=*/1);

  Session& s = group.session(0);
  StepBegin begin;
  begin.step = 2;
  begin.return_params = false;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const StepHandle c, s.Begin(begin));
  for (int p = 0; p < static_cast<int>(config.params.size()); ++p) {
    if (s.layout().owner[p] != 0) continue;
    std::vector<float> grad(config.params[p].numel());
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = RedundancyGroup::Gradient(2, p, i);
    grad[0] += 1.0f;
    ASSERT_THAT(testutil::SendGradient(s, c, p, 0, grad), IsOk());
  }
  EXPECT_THAT(s.Commit(c, 0, outcome.Callback()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "committed before a lost peer interrupted it"));
  for (uint64_t step = 2; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

// A session closed and released while its step's coordinator task runs (here from the step's
// own callback) is freed by that task, on the coordinator's thread, as it ends: nothing may run on
// it afterwards (ASan: a version that stepped the shadow in a task of its own, queued behind the
// step, ran it on freed memory).
TEST(StateRedundancyTest, ASessionLetGoDuringItsStepOutlivesTheShadowsUpdate) {
  RedundancyGroup group(2, ConfigOf("adamw"));
  group.StepOk(1);
  group.StepAndLetGo(2);
  // The coordinator's thread outlives the session it freed (it detaches from itself) and would
  // run whatever was queued behind the step: give it the time to, before the process ends.
  absl::SleepFor(absl::Milliseconds(200));
}

TEST(StateRedundancyTest, ShadowOfARankWithoutOneIsRefused) {
  RedundancyGroup group(2, ConfigOf("adamw"), /*redundancy=*/false);
  absl::Notification done;
  absl::Status status;
  group.session(0).ExportShadow([&](absl::StatusOr<std::shared_ptr<const StateDict>> s) {
    status = s.status();
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "keeps no shadow"));
}

}  // namespace
}  // namespace optstep
