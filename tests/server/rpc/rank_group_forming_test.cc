// RankGroup before and after its group formed, in a group that heals: rank 0 takes no session
// creation before it (a restarted rank 0 has yet to heal itself in with the other ranks'
// sessions), and a rank other than 0 waits for a lost rank 0 only after it (before it, rank 0's
// next process would find only some of the sessions, and the group restarts instead).

#include <cstdint>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/session.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/group_communicators.h"
#include "server/rpc/heal.h"
#include "server/rpc/rank_group.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;
using ::testing::Not;

RankGroupOptions Healing(int rank) {
  RankGroupOptions options;
  options.rank = rank;
  options.world_size = 3;
  options.heal = true;
  return options;
}

TEST(RankGroupFormingTest, RankZeroTakesCreationsOnlyOnceTheGroupFormed) {
  EngineOptions engine_options;
  engine_options.device.num_threads = 1;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(engine_options));
  RankGroup group(Healing(0), engine.get());
  v1::SessionSpec spec;
  spec.set_name("s");
  auto* param = spec.add_parameters();
  param->set_name("w");
  param->add_shape(4);
  spec.mutable_optimizer()->add_sub_optimizers()->set_kind("adamw");
  EXPECT_FALSE(group.formed());
  EXPECT_THAT(group.CreateSession(spec, "owner", "").status(),
              StatusIs(absl::StatusCode::kUnavailable, "the group is forming"));
  group.MarkFormed();
  EXPECT_TRUE(group.formed());
  // Formed: the creation gets past that (to the ranks, which never joined here).
  EXPECT_THAT(group.CreateSession(spec, "owner", "").status(),
              Not(StatusIs(absl::StatusCode::kUnavailable, "the group is forming")));
  EXPECT_EQ(engine->ListSessions().size(), 0u);
}

// A restarted rank 0 holds none of the group's sessions before it healed itself in: a close then
// is refused with nothing done. Before, the other ranks dropped their replicas and the caller was
// told NOT_FOUND, which a client that tried once before reads as closed.
TEST(RankGroupFormingTest, RankZeroTakesClosesOnlyOnceTheGroupFormed) {
  EngineOptions engine_options;
  engine_options.device.num_threads = 1;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(engine_options));
  RankGroup group(Healing(0), engine.get());
  EXPECT_THAT(group.CloseSession("s-1"),
              StatusIs(absl::StatusCode::kUnavailable,
                       "the group is forming (rank 0 heals itself in or restores the sessions); "
                       "close session 's-1' again"));
  group.MarkFormed();
  EXPECT_THAT(group.CloseSession("s-1"), Not(StatusIs(absl::StatusCode::kUnavailable)));
}

TEST(RankGroupFormingTest, RankZeroKnowsWhenEveryPeerWasToldThatTheGroupFormed) {
  RankGroup group(Healing(0), nullptr);
  group.MarkFormed();
  EXPECT_FALSE(group.AwaitFormedSeen(absl::Milliseconds(10)));
  group.NoteFormedSeen(1);
  group.NoteFormedSeen(7);  // no rank of the group
  group.NoteFormedSeen(0);  // rank 0 itself
  EXPECT_FALSE(group.AwaitFormedSeen(absl::Milliseconds(10)));
  group.NoteFormedSeen(2);
  EXPECT_TRUE(group.AwaitFormedSeen(absl::Milliseconds(10)));
}

TEST(RankGroupFormingTest, ARankWaitsForALostRankZeroOnlyOnceTheGroupFormed) {
  RankGroup group(Healing(1), nullptr);
  group.PeerLeft(0);
  EXPECT_FALSE(group.AwaitsRankZero());
  group.MarkFormed();
  EXPECT_TRUE(group.AwaitsRankZero());

  RankGroupOptions restarting = Healing(1);
  restarting.heal = false;
  RankGroup no_heal(restarting, nullptr);
  no_heal.MarkFormed();
  no_heal.PeerLeft(0);
  EXPECT_FALSE(no_heal.AwaitsRankZero());
}

// The communicators of a group whose heals never rebuild one here.
GroupCommunicators NoCommunicators() {
  return GroupCommunicators(
      [](const std::string&) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        return absl::UnavailableError("no communicator in this test");
      });
}

// Rank 1 of a group that heals over `communicators`, counting in `heals_failed` the heals of
// rank 0 it is told failed.
RankGroupOptions CountingFailedHeals(GroupCommunicators* communicators, int* heals_failed) {
  RankGroupOptions options = Healing(1);
  options.communicators = communicators;
  options.on_heal_failed = [heals_failed](const absl::Status&) { ++*heals_failed; };
  return options;
}

// `request` in phase `phase`.
v1::RegroupRequest InPhase(v1::RegroupRequest request, v1::RegroupRequest::Phase phase) {
  request.set_phase(phase);
  return request;
}

TEST(RankGroupFormingTest, StateMovesOnlyInTheHealOfItsGeneration) {
  GroupCommunicators communicators = NoCommunicators();
  RankGroupOptions options = Healing(1);
  options.communicators = &communicators;
  RankGroup group(options, nullptr);
  EXPECT_THAT(group.CheckHealing(1),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is not healing generation 0"));
  v1::RegroupRequest begin = Phase(1, 2, "127.0.0.1:1", v1::RegroupRequest::PHASE_BEGIN);
  OPTSTEP_ASSERT_OK(group.Regroup(begin));
  OPTSTEP_EXPECT_OK(group.CheckHealing(1));
  EXPECT_THAT(group.CheckHealing(2),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not in a heal into generation 2"));
  v1::RegroupRequest end = InPhase(begin, v1::RegroupRequest::PHASE_END);
  OPTSTEP_ASSERT_OK(group.Regroup(end));
  EXPECT_THAT(group.CheckHealing(1), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(RankGroupFormingTest, AHealOfAGenerationBegunAlreadyIsRefused) {
  // Two processes of rank 0 (its stand-in and its own) heal themselves in from the same
  // survivors, each into the generation above theirs: the later one is refused.
  GroupCommunicators communicators = NoCommunicators();
  int heals_failed = 0;
  RankGroup group(CountingFailedHeals(&communicators, &heals_failed), nullptr);
  v1::RegroupRequest begin = Phase(3, 0, "127.0.0.1:1", v1::RegroupRequest::PHASE_BEGIN);
  begin.set_stand_in(true);
  OPTSTEP_ASSERT_OK(group.Regroup(begin));
  EXPECT_EQ(group.stood_in_ranks(), std::vector<uint32_t>{0});
  v1::RegroupRequest other = begin;
  other.set_address("127.0.0.1:2");
  other.set_stand_in(false);
  EXPECT_THAT(group.Regroup(other),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "is at generation 3; a heal into generation 3 of rank 0 at 127.0.0.1:2 "
                       "comes too late"));
  EXPECT_EQ(group.addresses()[0], "127.0.0.1:1");
  // The refused heal ends, failed, on every rank: that ends neither the heal that runs here nor
  // the group (a failed heal of rank 0 restarts it).
  v1::RegroupRequest refused_end = InPhase(other, v1::RegroupRequest::PHASE_END);
  refused_end.set_failed(true);
  EXPECT_THAT(group.Regroup(refused_end),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "rank 1 ignores the end of a heal of rank 0 at 127.0.0.1:2 into generation "
                       "3: it runs the heal of 127.0.0.1:1 into generation 3"));
  OPTSTEP_EXPECT_OK(group.CheckHealing(3));
  EXPECT_EQ(heals_failed, 0);
  v1::RegroupRequest end = InPhase(begin, v1::RegroupRequest::PHASE_END);
  OPTSTEP_ASSERT_OK(group.Regroup(end));
  EXPECT_THAT(group.CheckHealing(3), StatusIs(absl::StatusCode::kFailedPrecondition));
  // The next generation is taken, with the whole set of stand-ins it tells of.
  other.set_generation(4);
  other.add_stood_in_ranks(2);
  OPTSTEP_ASSERT_OK(group.Regroup(other));
  EXPECT_EQ(group.addresses()[0], "127.0.0.1:2");
  EXPECT_EQ(group.stood_in_ranks(), std::vector<uint32_t>{2});
}

TEST(RankGroupFormingTest, AFailedHealLeavesTheRankLostAndItsConnectionsClosed) {
  // The rank's process may live on after its heal failed (its transfer failed), answering the
  // heartbeats, with none or part of its state: nothing may run with it until it heals in.
  GroupCommunicators communicators(
      [](const std::string& prefix) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        CommunicatorOptions options;
        options.prefix = prefix;
        return CreateCommunicator(options);
      });
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Communicator> session, communicators.Make("s"));
  RankGroupOptions options = Healing(1);
  options.communicators = &communicators;
  RankGroup group(options, nullptr);
  OPTSTEP_EXPECT_OK(group.PeersStatus());
  v1::RegroupRequest begin = Phase(1, 2, "127.0.0.1:1", v1::RegroupRequest::PHASE_BEGIN);
  OPTSTEP_ASSERT_OK(group.Regroup(begin));
  v1::RegroupRequest rebuild = InPhase(begin, v1::RegroupRequest::PHASE_REBUILD);
  OPTSTEP_ASSERT_OK(group.Regroup(rebuild));
  v1::RegroupRequest end = InPhase(begin, v1::RegroupRequest::PHASE_END);
  end.set_failed(true);
  OPTSTEP_ASSERT_OK(group.Regroup(end));
  EXPECT_THAT(group.PeersStatus(), StatusIs(absl::StatusCode::kUnavailable,
                                            "rank 2 lost (its heal into generation 1 failed)"));
  EXPECT_TRUE(group.peer_failed(2));
  EXPECT_THAT(session->Barrier(), StatusIs(absl::StatusCode::kUnavailable,
                                           "the heal of rank 2 into generation 1 "
                                           "failed"));
}

// Rank 0's own heal failed for a passing reason (`retry`): the survivors wait for its next
// process, up to RankGroup::kMaxHealsLostInARow heals in a row, and then restart the group. A
// failure for another reason restarts it at once. Before, every failure restarted it.
TEST(RankGroupFormingTest, ASurvivorWaitsForRankZeroAfterItsHealFailedForAPassingReason) {
  GroupCommunicators communicators = NoCommunicators();
  int heals_failed = 0;
  RankGroup group(CountingFailedHeals(&communicators, &heals_failed), nullptr);
  group.MarkFormed();
  const auto heal_fails = [&](uint64_t generation, bool retry) {
    v1::RegroupRequest begin = Phase(generation, 0, "127.0.0.1:1", v1::RegroupRequest::PHASE_BEGIN);
    OPTSTEP_ASSERT_OK(group.Regroup(begin));
    v1::RegroupRequest end = InPhase(begin, v1::RegroupRequest::PHASE_END);
    end.set_failed(true);
    end.set_retry(retry);
    OPTSTEP_ASSERT_OK(group.Regroup(end));
  };
  for (uint64_t g = 1; g <= RankGroup::kMaxHealsLostInARow; ++g) {
    ASSERT_NO_FATAL_FAILURE(heal_fails(g, /*retry=*/true));
    EXPECT_EQ(heals_failed, 0) << "heal " << g;
    EXPECT_TRUE(group.AwaitsRankZero());
  }
  ASSERT_NO_FATAL_FAILURE(heal_fails(RankGroup::kMaxHealsLostInARow + 1, /*retry=*/true));
  EXPECT_EQ(heals_failed, 1);  // the same failure over and over: the group restarts
  ASSERT_NO_FATAL_FAILURE(heal_fails(RankGroup::kMaxHealsLostInARow + 2, /*retry=*/false));
  EXPECT_EQ(heals_failed, 2);
}

TEST(RankGroupFormingTest, TheEndOfAHealNeverBegunHereChangesNothing) {
  // A heal that failed because its rank was lost ends on every rank, and so reaches that rank's
  // next process, which never began it.
  GroupCommunicators communicators = NoCommunicators();
  int heals_failed = 0;
  RankGroup group(CountingFailedHeals(&communicators, &heals_failed), nullptr);
  v1::RegroupRequest end = Phase(2, 0, "127.0.0.1:1", v1::RegroupRequest::PHASE_END);
  end.set_failed(true);
  EXPECT_THAT(group.Regroup(end),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "rank 1 ignores the end of a heal of rank 0 at 127.0.0.1:1 into generation "
                       "2: it runs no heal"));
  EXPECT_EQ(heals_failed, 0);
  EXPECT_EQ(group.generation(), 0u);
}

}  // namespace
}  // namespace optstep
