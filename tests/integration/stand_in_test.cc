// A rank of a real 3-rank group on loopback that does not return within --rejoin_timeout_ms is
// stood in for by its buddy, in the buddy's process (docs/deploy.md, "A rank that does not
// return"): training goes on through the stand-in, bit for bit, until the rank's own process
// takes its place back. While rank 0 is stood in, another rank restarted finds the group at the
// stand-in's store and is healed in there, and the stand-in writes the automatic checkpoints;
// another rank lost for good is stood in for too (4 ranks). A
// stand-in replaced by a process lost in its heal, or one that missed its heal's end, is
// started again, but not one whose heal merely begins late. A stand-in shares its host's memory
// budget, and sessions are created meanwhile.

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/healing_group.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitHealth;
using ::optstep::testutil::Group;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::OpenStep;
using ::optstep::testutil::Restart;
using ::optstep::testutil::Running;
using ::optstep::testutil::SameResolutionsEverywhere;
using ::optstep::testutil::SameStateAndParameters;
using ::optstep::testutil::SpreadSpec;
using ::optstep::testutil::SteppedReference;
using ::optstep::testutil::StepSpread;
using ::optstep::testutil::Trainer;
using ::testing::HasSubstr;

constexpr int kWorld = 3;

// The healing flags, with a rejoin timeout short enough for a test.
std::vector<std::string> StandInFlags() {
  std::vector<std::string> flags = testutil::HealingFlags(absl::Seconds(2));
  flags.push_back("--metrics_port=-1");
  return flags;
}

// The connect timeout of a trainer that connects while a rank is stood in.
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);

// A trainer that connects now, given every rank's own address: the first rank that answers
// tells it where a rank stood in for is served.
absl::StatusOr<std::unique_ptr<Client>> ConnectNow(const Group& group) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = kConnectTimeout;
  return Client::Connect(options);
}

// Waits until rank `rank`'s own process took its place back from its stand-in (the session's
// layout lists `stood_in` stand-ins still, none of them for `rank`, and the rank at
// `own_address`).
bool AwaitOwnProcess(Client& trainer, const std::string& id, int rank,
                     const std::string& own_address, int stood_in = 0) {
  for (const absl::Time end = absl::Now() + absl::Seconds(30); absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(100));
    absl::StatusOr<v1::SessionInfo> now = trainer.GetSession(id);
    if (now.ok() && now->layout().stood_in_ranks_size() == stood_in &&
        now->layout().rank_targets(rank) == own_address) {
      return true;
    }
  }
  return false;
}

// What each case begins with: a group of `ranks` run with `flags`, its trainer, a reference
// session stepped `steps` times undisturbed, and the session `id`, named `name`, stepped
// `stepped` times; both of `storage`.
struct SteppedGroup {
  void Start(int ranks, const std::vector<std::string>& flags, uint64_t steps,
             const std::string& name, uint64_t stepped = 1,
             v1::ParameterStorage storage = v1::PARAMETER_STORAGE_REPLICATED) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(group, testutil::StartGroup(ranks, flags));
    ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
    trainer = Trainer(group);
    ASSERT_NE(trainer, nullptr);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference, SteppedReference(*trainer, steps, storage));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info,
                                 trainer->CreateSession(SpreadSpec(name, storage)));
    id = info.session_id();
    for (uint64_t step = 1; step <= stepped; ++step) {
      ASSERT_THAT(StepSpread(*trainer, id, step).status(), IsOk());
    }
  }

  Group group;
  std::unique_ptr<Client> trainer;
  v1::SessionInfo reference;
  std::string id;
};

// A rank that does not return within --rejoin_timeout_ms is stood in for by its buddy (rank 2
// for rank 1; rank 0, which serves the rendezvous, for rank 2; rank 1 for rank 0, its stand-in
// serving a rendezvous store of its own) in the buddy's process: the survivors wait for that
// instead of exiting, the trainer's step waits, follows the stand-in's address
// (SessionInfo.layout.stood_in_ranks, from another rank for rank 0) and is redone, never rewound.
// When the rank's own process returns it takes its place back (rank 0: the stand-in gives way and
// rank 0 heals itself in), the stand-in stops without the group counting the rank gone, and the
// trainer goes back to the rank's own address. Training ends bit for bit with an undisturbed
// session.
// Run for the rank lost (its buddy stands in for it) and the parameter storage (under OWNERS the
// stand-in alone holds the rank's masters, and the trainer pulls them from it).
class StoodInRankTest : public ::testing::TestWithParam<std::tuple<int, v1::ParameterStorage>> {};

TEST_P(StoodInRankTest, ARankThatDoesNotReturnIsStoodInForUntilItDoes) {
  const auto [dead, storage] = GetParam();
  const int buddy = (dead + 1) % kWorld;
  const std::vector<std::string> flags = StandInFlags();
  constexpr uint64_t kSteps = 6;
  SteppedGroup s;
  ASSERT_NO_FATAL_FAILURE(s.Start(kWorld, flags, kSteps, "stood-in", /*stepped=*/2, storage));
  auto& [group, trainer, reference, id] = s;
  const std::string own_address = group[dead]->address();
  group[dead]->SignalAndWait(SIGKILL);
  // Waits out the rejoin timeout and the stand-in's heal, then is redone on the stand-in.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, StepSpread(*trainer, id, 3));
  EXPECT_EQ(reply.step, 3u);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->GetSession(id));
  ASSERT_EQ(info.layout().stood_in_ranks_size(), 1);
  EXPECT_EQ(info.layout().stood_in_ranks(0), static_cast<uint32_t>(dead));
  EXPECT_NE(info.layout().rank_targets(dead), own_address);
  // A trainer that connects now, given the lost rank's own address, is led to the stand-in, at
  // once where another rank answers it first.
  const absl::Time connecting = absl::Now();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> late, ConnectNow(group));
  EXPECT_LT(absl::Now() - connecting, kConnectTimeout / 2) << "waited for the lost address";
  ASSERT_THAT(StepSpread(*late, id, 4).status(), IsOk());
  EXPECT_EQ(testutil::ScrapeMetrics(group[buddy]->metrics_port())["optstep_stand_ins"], 1);
  for (int r = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    EXPECT_TRUE(Running(*group[r])) << "rank " << r << " exited";
  }

  // A step begun at the stand-in and left open: its trainer learns as soon as the stand-in gives
  // way, UNAVAILABLE (redone at the rank's own process), not after the shutdown grace period.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<OpenStep> open,
      OpenStep::BeginWithoutGradients(
          grpc::CreateChannel(info.layout().rank_targets(dead), grpc::InsecureChannelCredentials()),
          id, 5));
  grpc::Status open_end;
  absl::Time open_ended;
  std::thread await_end([&] {
    open_end = open->AwaitEnd();
    open_ended = absl::Now();
  });
  absl::Cleanup join = [&] { await_end.join(); };

  ASSERT_THAT(Restart(group, dead, flags), IsOk());
  ASSERT_TRUE(AwaitOwnProcess(*trainer, id, dead, own_address))
      << "rank " << dead << "'s own process did not take its place back";
  const absl::Time replaced = absl::Now();
  EXPECT_THAT(testutil::AwaitMetric(group[buddy]->metrics_port(), "optstep_stand_ins", 0), IsOk());
  std::move(join).Invoke();
  EXPECT_EQ(open_end.error_code(), grpc::StatusCode::UNAVAILABLE) << open_end.error_message();
  EXPECT_THAT(open_end.error_message(), HasSubstr("step 5: rank " + std::to_string(dead) +
                                                  " shut down before this step ended"));
  EXPECT_LT(open_ended - replaced, absl::Seconds(5)) << "the stand-in waited out a grace period";
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  // The late trainer still knows the stand-in, which stopped: a pull (from each owner under
  // OWNERS) follows the rank back to its own process instead of failing UNAVAILABLE.
  EXPECT_THAT(late->PullParameters(id, DType::kF32, {}).status(), IsOk());
  for (uint64_t step = 5; step <= kSteps; ++step) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply later, StepSpread(*trainer, id, step));
    EXPECT_EQ(later.step, step);
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), id), IsOk());
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    RankAndStorage, StoodInRankTest,
    ::testing::Combine(::testing::Values(0, 1, 2),
                       ::testing::Values(v1::PARAMETER_STORAGE_REPLICATED,
                                         v1::PARAMETER_STORAGE_OWNERS)),
    [](const ::testing::TestParamInfo<std::tuple<int, v1::ParameterStorage>>& info) {
      return absl::StrCat(
          "Rank", std::get<0>(info.param),
          std::get<1>(info.param) == v1::PARAMETER_STORAGE_OWNERS ? "Owners" : "Replicated");
    });

// While rank 0 is stood in for by rank 1 (its own process away), rank 2 is killed and restarted:
// its configured store (rank 0's own) does not answer, and it finds the group at the stand-in's
// store, which the survivors' heartbeats tell it of (PingRequest.rendezvous). The stand-in heals it
// in (its state from the stand-in's copy) and writes the automatic checkpoints meanwhile. Once
// rank 0's own process is back, a client that still knows the stopped stand-in follows rank 0
// there (a checkpoint, a pull), and the run ends bit for bit with an undisturbed session.
TEST(StandInTest, ARankRestartedWhileRankZeroIsStoodInRejoinsAtTheStandIn) {
  testutil::ScopedTempDir root("optstep-stand-in");
  std::vector<std::string> flags = StandInFlags();
  flags.push_back("--checkpoint_root=" + root.path());
  flags.push_back("--checkpoint_every_steps=1");
  constexpr uint64_t kSteps = 6;
  SteppedGroup s;
  ASSERT_NO_FATAL_FAILURE(s.Start(kWorld, flags, kSteps, "rank-0-away"));
  auto& [group, trainer, reference, id] = s;
  const std::string rank_zero_address = group[0]->address();
  group[0]->SignalAndWait(SIGKILL);
  ASSERT_THAT(StepSpread(*trainer, id, 2).status(), IsOk());  // through the stand-in
  // Connected while rank 0 is stood in: it knows the stand-in (and pulls only once it stopped).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> puller, ConnectNow(group));
  ASSERT_THAT(puller->GetSession(id).status(), IsOk());  // the layout, cached

  group[2]->SignalAndWait(SIGKILL);
  ASSERT_THAT(Restart(group, 2, flags), IsOk());
  ASSERT_TRUE(AwaitHealth(*group[2], true, absl::Seconds(30)))
      << "rank 2 did not rejoin the group while rank 0 is stood in for";
  EXPECT_TRUE(Running(*group[1])) << "rank 1, which hosts the stand-in, exited";
  ASSERT_THAT(StepSpread(*trainer, id, 3).status(), IsOk());
  const std::string saved = absl::StrCat(root.path(), "/auto/", id, "/step-3/manifest.json");
  for (const absl::Time end = absl::Now() + absl::Seconds(20);
       !testutil::PathExists(saved) && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(testutil::PathExists(saved)) << "no automatic checkpoint while rank 0 is stood in";

  ASSERT_THAT(Restart(group, 0, flags), IsOk());
  // Watched by another client: the trainer still knows the stand-in, which stopped.
  std::unique_ptr<Client> watcher = Trainer(group);
  ASSERT_NE(watcher, nullptr);
  ASSERT_TRUE(AwaitOwnProcess(*watcher, id, 0, rank_zero_address))
      << "rank 0's own process did not take its place back";
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  // A checkpoint call and a pull find the stand-in gone and ask where rank 0 is served now.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::CheckpointProgress saved_back, trainer->Save(id, "rank-0-back"));
  EXPECT_EQ(saved_back.step(), 3u);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters pulled, puller->PullParameters(id, DType::kF32, {}));
  EXPECT_EQ(pulled.step, 3u);
  for (uint64_t step = 4; step <= kSteps; ++step) {
    ASSERT_THAT(StepSpread(*trainer, id, step).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), id), IsOk());
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

// Four ranks: rank 0 is lost for good, and rank 1 stands in for it; then rank 2 too, and rank 3
// stands in for it, finding the group at rank 0's stand-in's store. Before, rank 2's stand-in
// looked for the group at rank 0's configured store, which no longer answers, and the survivors
// exited once their wait was over. Training goes on through both, bit for bit, and once rank 0's
// own process is back, rank 2's stand-in publishes its address to rank 0's configured store
// again, as the other ranks do, and rank 0 heals itself in.
TEST(StandInTest, ARankLostWhileRankZeroIsStoodInIsStoodInForToo) {
  constexpr int kRanks = 4;
  const std::vector<std::string> flags = StandInFlags();
  constexpr uint64_t kSteps = 5;
  SteppedGroup s;
  ASSERT_NO_FATAL_FAILURE(s.Start(kRanks, flags, kSteps, "two-stood-in"));
  auto& [group, trainer, reference, id] = s;
  group[0]->SignalAndWait(SIGKILL);
  ASSERT_THAT(StepSpread(*trainer, id, 2).status(), IsOk());  // through rank 0's stand-in
  group[2]->SignalAndWait(SIGKILL);
  ASSERT_THAT(StepSpread(*trainer, id, 3).status(), IsOk());  // and rank 2's
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo now, trainer->GetSession(id));
  EXPECT_EQ(now.layout().stood_in_ranks_size(), 2);
  ASSERT_THAT(StepSpread(*trainer, id, 4).status(), IsOk());
  const std::string rank_zero_address = group[0]->address();
  ASSERT_THAT(Restart(group, 0, flags), IsOk());
  std::unique_ptr<Client> watcher = Trainer(group);
  ASSERT_NE(watcher, nullptr);
  ASSERT_TRUE(AwaitOwnProcess(*watcher, id, 0, rank_zero_address, /*stood_in=*/1))
      << "rank 0's own process did not take its place back";
  ASSERT_THAT(StepSpread(*trainer, id, 5).status(), IsOk());
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), id), IsOk());
  for (int r : {0, 1, 3}) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

// Rank 2 dies in every heal (out of memory each time) while rank 0 is stood in for: its stand-in
// waits for three heals in a row, as rank 0 would, and then asks for a restart of the group, which
// its host (rank 1) makes by exiting for its supervisor. Before, the stand-in only logged it and
// nothing exited: the group paused at each new heal of rank 2, for as long as its supervisor
// restarted it.
TEST(StandInTest, ARankLostInEveryHealWhileRankZeroIsStoodInRestartsTheGroupAfterThree) {
  const std::vector<std::string> flags = StandInFlags();
  SteppedGroup s;
  ASSERT_NO_FATAL_FAILURE(s.Start(kWorld, flags, /*steps=*/2, "doomed"));
  auto& [group, trainer, reference, id] = s;
  group[0]->SignalAndWait(SIGKILL);
  ASSERT_THAT(StepSpread(*trainer, id, 2).status(), IsOk());  // through rank 0's stand-in
  group[2]->SignalAndWait(SIGKILL);
  std::vector<std::string> dying = flags;
  dying.push_back("--kill_during_heal=transfer");
  for (int heal = 1; heal <= 4; ++heal) {
    ASSERT_THAT(Restart(group, 2, dying), IsOk());
    const int status = group[2]->WaitFor(absl::Seconds(60));
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "heal " << heal;
    if (heal == 3) {
      EXPECT_TRUE(Running(*group[1])) << "rank 1 after three heals";
    }
  }
  const int exited = group[1]->WaitFor(absl::Seconds(30));
  ASSERT_NE(exited, -1) << "rank 1, which hosts rank 0's stand-in, did not exit for a restart";
  ASSERT_TRUE(WIFEXITED(exited));
  EXPECT_EQ(WEXITSTATUS(exited), 75);
}

// Rank 1 of a group run with `flags` is lost for good, and rank 2 stands in for it: a trainer
// with a reference session stepped `steps` times, and session `id_` stepped once before the loss
// and once through the stand-in.
class LostRankOneTest : public ::testing::Test {
 protected:
  static constexpr int kDead = 1;
  static constexpr int kBuddy = 2;

  void LoseRankOne(const std::vector<std::string>& flags, uint64_t steps) {
    SteppedGroup s;
    ASSERT_NO_FATAL_FAILURE(s.Start(kWorld, flags, steps, "stood-in"));
    group_ = std::move(s.group);
    trainer_ = std::move(s.trainer);
    reference_ = s.reference;
    id_ = s.id;
    own_address_ = group_[kDead]->address();
    group_[kDead]->SignalAndWait(SIGKILL);
    // Through the stand-in.
    ASSERT_THAT(StepSpread(*trainer_, id_, 2).status(), IsOk());
  }

  Group group_;
  std::unique_ptr<Client> trainer_;
  v1::SessionInfo reference_;
  std::string id_;
  std::string own_address_;
};

// Rank 1 is stood in for by rank 2, and its own process returns and dies while it heals in
// (--kill_during_heal=transfer). Before, the stand-in, replaced in the group by that process,
// stayed up unused, rank 2 started no second one, and the group restarted once the stand-in's
// wait was over. Now rank 2 stops it and stands in again after the rejoin timeout; the trainer's
// step is redone there, and the run ends bit for bit with an undisturbed session once rank 1's
// next process is back.
TEST_F(LostRankOneTest, AStandInReplacedByAProcessLostInItsHealStandsInAgain) {
  const std::vector<std::string> flags = StandInFlags();
  constexpr uint64_t kSteps = 5;
  ASSERT_NO_FATAL_FAILURE(LoseRankOne(flags, kSteps));

  std::vector<std::string> dying = flags;
  dying.push_back("--kill_during_heal=transfer");
  ASSERT_THAT(Restart(group_, kDead, dying), IsOk());
  const int died = group_[kDead]->WaitFor(absl::Seconds(30));
  ASSERT_TRUE(WIFSIGNALED(died) && WTERMSIG(died) == SIGKILL) << "rank 1 did not die healing in";
  // Waits out the rejoin timeout and the second stand-in's heal, then is redone on it.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, StepSpread(*trainer_, id_, 3));
  EXPECT_EQ(reply.step, 3u);
  EXPECT_EQ(testutil::ScrapeMetrics(group_[kBuddy]->metrics_port())["optstep_stand_ins"], 1);
  for (int r : {0, kBuddy}) EXPECT_TRUE(Running(*group_[r])) << "rank " << r << " exited";

  ASSERT_THAT(Restart(group_, kDead, flags), IsOk());
  ASSERT_TRUE(AwaitOwnProcess(*trainer_, id_, kDead, own_address_))
      << "rank 1's own process did not take its place back";
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(AwaitHealth(*group_[r], true, absl::Seconds(20))) << "rank " << r;
  }
  for (uint64_t step = 4; step <= kSteps; ++step) {
    ASSERT_THAT(StepSpread(*trainer_, id_, step).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), id_), IsOk());
  EXPECT_THAT(SameResolutionsEverywhere(group_), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
}

// Rank 0 (--drop_first_peer_call=HealEnd:1:every) drops every attempt of its call that ends the
// heal of rank 1's stand-in, until the group's timeout ends the call: the stand-in misses the
// end for good. Before, it stayed paused, and the trainer's step waited on it in vain. Now its
// host stops it once rank 0's heartbeat answers say the heal ended, and stands in again.
TEST_F(LostRankOneTest, AStandInThatMissedItsHealsEndIsStartedAgain) {
  std::vector<std::string> flags = StandInFlags();
  flags.push_back("--drop_first_peer_call=HealEnd:1:every");
  flags.push_back("--comm_timeout_ms=4000");  // how long rank 0 makes the dropped call
  constexpr uint64_t kSteps = 3;
  // Step 2 goes through the second stand-in: the first one's heal never ends on it.
  ASSERT_NO_FATAL_FAILURE(LoseRankOne(flags, kSteps));
  EXPECT_EQ(testutil::ScrapeMetrics(group_[kBuddy]->metrics_port())["optstep_stand_ins"], 1);
  ASSERT_THAT(StepSpread(*trainer_, id_, 3).status(), IsOk());
  EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), id_), IsOk());
  for (int r : {0, kBuddy}) EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
}

// Rank 0 (--drop_first_peer_call=HealBegin:2) loses its first call that begins a heal on rank 2,
// as a connection reset would: the heal of rank 1's stand-in fails with every process alive.
// Before, rank 0 took a stand-in's failed heal for one that would fail again, and exited for a
// restart of the whole group. Now the group waits: rank 2 stops the stand-in and stands in
// again, and the step goes through the second one.
TEST_F(LostRankOneTest, AStandInWhoseHealBeginIsLostOnTheWayStandsInAgain) {
  std::vector<std::string> flags = StandInFlags();
  flags.push_back("--drop_first_peer_call=HealBegin:2");
  ASSERT_NO_FATAL_FAILURE(LoseRankOne(flags, /*steps=*/3));
  EXPECT_EQ(testutil::ScrapeMetrics(group_[kBuddy]->metrics_port())["optstep_stand_ins"], 1);
  ASSERT_THAT(StepSpread(*trainer_, id_, 3).status(), IsOk());
  EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), id_), IsOk());
  for (int r : {0, kBuddy}) EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
}

// Rank 0 begins the stand-in's heal late (--delay_rejoin_ms, as when the heal waits for the
// group's lifecycle lock): until then the group still knows rank 1 at its lost process's address.
// Before, rank 2 took that for another process having taken the rank's place and been lost in
// its heal: it stopped its stand-in, whose heal then failed, and rank 0 exited for a restart of
// the group. Now the stand-in heals in late, and the step goes through it.
TEST_F(LostRankOneTest, AStandInWhoseHealBeginsLateIsKept) {
  std::vector<std::string> flags = StandInFlags();
  flags.push_back("--delay_rejoin_ms=1500");
  ASSERT_NO_FATAL_FAILURE(LoseRankOne(flags, /*steps=*/3));
  EXPECT_EQ(testutil::ScrapeMetrics(group_[kBuddy]->metrics_port())["optstep_stand_ins"], 1);
  ASSERT_THAT(StepSpread(*trainer_, id_, 3).status(), IsOk());
  EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), id_), IsOk());
  for (int r : {0, kBuddy}) EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
}

// While rank 1 is stood in for, a new session is created and stepped: the stand-in shares its
// host's memory budget. Before, it took the whole free part of rank 2's budget, and every new
// session was refused RESOURCE_EXHAUSTED on rank 2 until rank 1's own process was back.
TEST_F(LostRankOneTest, ASessionIsCreatedAndSteppedWhileARankIsStoodIn) {
  ASSERT_NO_FATAL_FAILURE(LoseRankOne(StandInFlags(), /*steps=*/1));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo created,
                               trainer_->CreateSession(SpreadSpec("while-stood-in")));
  EXPECT_EQ(created.layout().stood_in_ranks_size(), 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, StepSpread(*trainer_, created.session_id(), 1));
  EXPECT_EQ(reply.step, 1u);
  for (int r : {0, kBuddy}) EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
}

}  // namespace
}  // namespace optstep
