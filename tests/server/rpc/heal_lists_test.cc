// A restarted rank 0 heals itself in with the sessions every survivor lists: a creation or a
// close cut by the loss of rank 0 reached only some of them (SessionsCutOnSurvivors), and is
// closed on those. Their resolutions may differ: a resolution the loss cut began on some
// survivors only, and the heal's end rebases every rank.
// The catch-up of a step some ranks finished (PlanCatchUp) is covered here too.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/rpc/heal.h"
#include "server/rpc/rank_group.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// A survivor's list: sessions (id, resolutions) in id order.
v1::ListReplicasResponse Listed(const std::vector<std::pair<std::string, uint64_t>>& sessions) {
  v1::ListReplicasResponse list;
  list.set_awaits_rank_zero(true);
  for (const auto& [id, resolutions] : sessions) {
    v1::CreateReplicaRequest* replica = list.add_replicas();
    replica->set_session_id(id);
    replica->set_resolutions(resolutions);
  }
  return list;
}

using Ids = std::vector<std::string>;

TEST(HealListsTest, TheSameSessionsHealWhole) {
  const v1::ListReplicasResponse list = Listed({{"a", 4}, {"b", 0}});
  EXPECT_EQ(SessionsCutOnSurvivors({v1::ListReplicasResponse(), list, list, list}), Ids());
  EXPECT_EQ(SessionsCutOnSurvivors({v1::ListReplicasResponse(), Listed({}), Listed({})}), Ids());
}

TEST(HealListsTest, ASessionOnlySomeSurvivorsHoldIsCut) {
  // A creation cut after rank 1 made its replica, before rank 2 did.
  EXPECT_EQ(SessionsCutOnSurvivors(
                {v1::ListReplicasResponse(), Listed({{"a", 4}, {"b", 0}}), Listed({{"a", 4}})}),
            Ids({"b"}));
  // A close cut after rank 1 dropped its replica.
  EXPECT_EQ(SessionsCutOnSurvivors(
                {v1::ListReplicasResponse(), Listed({{"b", 0}}), Listed({{"a", 4}, {"b", 0}})}),
            Ids({"a"}));
  EXPECT_EQ(SessionsCutOnSurvivors({v1::ListReplicasResponse(), Listed({{"a", 4}, {"d", 0}}),
                                    Listed({{"a", 4}}), Listed({{"a", 4}, {"c", 1}, {"d", 0}})}),
            Ids({"c", "d"}));
}

TEST(HealListsTest, SurvivorsAResolutionApartHealWhole) {
  // Rank 0 was lost after rank 1 began resolving a step of 'b' (which the loss interrupted) and
  // before rank 2 did: the heal's end rebases both, and the step is redone.
  EXPECT_EQ(SessionsCutOnSurvivors({v1::ListReplicasResponse(), Listed({{"a", 4}, {"b", 3}}),
                                    Listed({{"a", 4}, {"b", 2}})}),
            Ids());
  EXPECT_EQ(SessionsCutOnSurvivors({v1::ListReplicasResponse(), Listed({{"a", 4}, {"b", 2}}),
                                    Listed({{"a", 4}, {"b", 3}}), Listed({{"a", 5}, {"b", 3}})}),
            Ids());
  // Not the sessions, though.
  EXPECT_EQ(SessionsCutOnSurvivors(
                {v1::ListReplicasResponse(), Listed({{"a", 4}}), Listed({{"a", 5}, {"b", 0}})}),
            Ids({"b"}));
}

// A rank's list for the catch-up: sessions (id, step) in id order.
v1::ListReplicasResponse AtSteps(const std::vector<std::pair<std::string, uint64_t>>& sessions) {
  v1::ListReplicasResponse list;
  for (const auto& [id, step] : sessions) {
    v1::CreateReplicaRequest* replica = list.add_replicas();
    replica->set_session_id(id);
    replica->set_step(step);
  }
  return list;
}

TEST(HealListsTest, EveryRankAtOneStepCatchesUpNothing) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      std::vector<CatchUpSources> plan,
      PlanCatchUp({AtSteps({{"a", 3}, {"b", 0}}), AtSteps({{"a", 3}, {"b", 0}}),
                   AtSteps({{"a", 3}, {"b", 0}})}));
  ASSERT_EQ(plan.size(), 3u);
  for (const CatchUpSources& sources : plan) EXPECT_TRUE(sources.empty());
}

TEST(HealListsTest, ARankAStepBehindTakesItFromTheLowestRankThatFinishedIt) {
  // Session a: ranks 0 and 2 finished step 3 where rank 1's all-gather failed. Session b: rank 2
  // alone finished step 8 (rank 0, healed in, imported rank 1's masters, a step behind).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      std::vector<CatchUpSources> plan,
      PlanCatchUp({AtSteps({{"a", 3}, {"b", 7}}), AtSteps({{"a", 2}, {"b", 7}}),
                   AtSteps({{"a", 3}, {"b", 8}})}));
  EXPECT_EQ(plan[0], (CatchUpSources{{"b", 2}}));
  EXPECT_EQ(plan[1], (CatchUpSources{{"a", 0}, {"b", 2}}));
  EXPECT_EQ(plan[2], CatchUpSources());
}

TEST(HealListsTest, ARankOfAnEarlierReleaseIsLeftOut) {
  // Its list carries no steps: neither a source nor behind.
  v1::ListReplicasResponse earlier = AtSteps({{"a", 0}});
  earlier.mutable_replicas(0)->clear_step();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<CatchUpSources> plan,
                               PlanCatchUp({AtSteps({{"a", 5}}), earlier, AtSteps({{"a", 4}})}));
  EXPECT_EQ(plan[1], CatchUpSources());
  EXPECT_EQ(plan[2], (CatchUpSources{{"a", 0}}));
}

TEST(HealListsTest, ARankFurtherBehindIsNamed) {
  EXPECT_THAT(PlanCatchUp({AtSteps({{"a", 5}}), AtSteps({{"a", 3}})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "session 'a' is at step 3 on rank 1 and at step 5 on rank 0"));
}

TEST(HealListsTest, ACatchUpFromARankThatIsNotAPeerIsRefused) {
  EngineOptions engine_options;
  engine_options.device.num_threads = 1;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(engine_options));
  RankGroupOptions options;
  options.rank = 1;
  options.world_size = 3;
  RankGroup group(options, engine.get());
  EXPECT_THAT(CatchUpFromPeers(engine.get(), &group, {{"s", 3}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot take a step from rank 3"));
  EXPECT_THAT(CatchUpFromPeers(engine.get(), &group, {{"s", 1}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot take a step from rank 1"));
  EXPECT_THAT(CatchUpFromPeers(engine.get(), &group, {{"s", 0}}),
              StatusIs(absl::StatusCode::kNotFound));  // a peer, but no such session
  // Every source is checked before any session is touched.
  EXPECT_THAT(CatchUpFromPeers(engine.get(), &group, {{"a", 0}, {"b", 3}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "session 'b'"));
}

}  // namespace
}  // namespace optstep
