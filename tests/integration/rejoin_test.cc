// A rank of a real 3-rank group on loopback (rank 1, and rank 0) is SIGKILLed between steps and
// restarted with its ordinal on its port (as its supervisor does): with --state_redundancy=1 the
// other ranks stay up (NOT_SERVING while it is away, their liveness service SERVING), rank 0 heals
// it into the running group, or a restarted rank 0 heals itself into the group the others kept
// (a new generation, the sessions' communicators rebuilt, its replicas created with the same ids,
// the masters from a peer, its own Adam state from its buddy's shadow and its shadow duty from its
// predecessor), the group turns SERVING again and training goes on without a rollback, ending
// bit for bit with an undisturbed run. A rank killed while a step runs (after it and its peers
// stepped their own parameters, before the all-gather) interrupts the step on the others, which
// wait for it as well: once it is healed in, the trainer's step is redone without a rollback and
// the parameters and optimizer state end bit for bit with an undisturbed session. A rank killed
// again during its own heal is waited for, and its next process heals in. A state import
// (a checkpoint load, an automatic restore, a state dict) replaces each rank's state on its own
// rank: the shadows are fetched again under the import's hold, so that a rank lost afterwards
// still heals. A rolling restart (each rank shut down on purpose and started again in turn, rank 0
// last) loses no step. Two ranks lost at once are not waited for: the survivor exits for a restart
// of the group (status 75). After every heal each session counts as many resolutions on every
// rank, which a checkpoint's hold settles the ranks by, also when the loss cut a step that one
// rank alone had begun (rank 0 lost too: it heals itself in, and the waiting rank's collective
// ends when the survivors close their connections).

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/healing_group.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitHealth;
using ::optstep::testutil::Group;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::kSpreadParams;
using ::optstep::testutil::Live;
using ::optstep::testutil::Restart;
using ::optstep::testutil::Running;
using ::optstep::testutil::SameResolutionsEverywhere;
using ::optstep::testutil::SameStateAndParameters;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::SpreadGradients;
using ::optstep::testutil::SpreadSpec;
using ::optstep::testutil::StateOf;
using ::optstep::testutil::SteppedReference;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::StepSpread;
using ::optstep::testutil::Trainer;

constexpr int kWorld = 3;
constexpr int kDead = 1;  // the rank killed by the tests that are not run for each rank
const std::vector<std::string> kFlags = testutil::HealingFlags();

// CreateSession of an unnamed session with one request id, as a client retries it: the id of the
// session answered, which the call did not attach to.
absl::StatusOr<std::string> CreateUnnamed(const ServerProcess& rank0) {
  OPTSTEP_ASSIGN_OR_RETURN(
      v1::CreateSessionResponse response,
      testutil::CreateWithRequestId(rank0.address(), SmallSpec(""), "rejoin-test-unnamed"));
  if (response.attached()) return absl::InternalError("a retried creation attached");
  return response.summary().session_id();
}

// The parameters of an Adam session after steps 1..4 and of another after its steps 1..2 (made
// after step 2 of the first), on `group`; with `dead` >= 0, rank `dead` is killed after step 2
// and restarted before step 3.
struct Trained {
  std::string stepped;
  std::string fresh;
};
absl::StatusOr<Trained> Train(Group& group, int dead) {
  if (!AwaitHealth(*group[0], true, absl::Seconds(20))) return absl::InternalError("not serving");
  std::unique_ptr<Client> trainer = Trainer(group);
  if (trainer == nullptr) return absl::InternalError("no trainer");
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo stepped, trainer->CreateSession(SmallSpec("stepped")));
  for (uint64_t step = 1; step <= 2; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, stepped.session_id(), step).status());
  }
  // Made but not stepped before the loss.
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo fresh, trainer->CreateSession(SmallSpec("fresh")));
  // A tensor of 4 MiB: its state crosses between ranks in messages above grpc's default bound.
  v1::SessionSpec large_spec = SmallSpec("large");
  large_spec.mutable_parameters(0)->clear_shape();
  large_spec.mutable_parameters(0)->add_shape(1024);
  large_spec.mutable_parameters(0)->add_shape(1024);
  OPTSTEP_RETURN_IF_ERROR(trainer->CreateSession(large_spec).status());
  // An unnamed creation whose answer is taken for lost, retried after the heal below.
  OPTSTEP_ASSIGN_OR_RETURN(const std::string unnamed, CreateUnnamed(*group[0]));
  if (dead >= 0) {
    group[dead]->SignalAndWait(SIGKILL);
    for (int r = 0; r < kWorld; ++r) {
      if (r != dead && !AwaitHealth(*group[r], false, absl::Seconds(10))) {
        return absl::InternalError(absl::StrCat("rank ", r, " did not notice the loss"));
      }
      // Not ready, yet alive: a liveness probe leaves it running while it waits.
      if (r != dead && !Live(*group[r])) {
        return absl::InternalError(absl::StrCat("rank ", r, " is not live while it waits"));
      }
    }
    OPTSTEP_RETURN_IF_ERROR(Restart(group, dead, kFlags));
    for (int r = 0; r < kWorld; ++r) {
      if (!AwaitHealth(*group[r], true, absl::Seconds(20))) {
        return absl::InternalError(absl::StrCat("rank ", r, " is not SERVING after the rejoin"));
      }
    }
  }
  // The retry answers the session its first call made, also from a rank 0 healed from its peers.
  OPTSTEP_ASSIGN_OR_RETURN(const std::string retried, CreateUnnamed(*group[0]));
  if (retried != unnamed) {
    return absl::InternalError(
        absl::StrCat("the retried creation made session ", retried, " beside ", unnamed));
  }
  for (uint64_t step = 3; step <= 4; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, stepped.session_id(), step).status());
  }
  for (uint64_t step = 1; step <= 2; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, fresh.session_id(), step).status());
  }
  OPTSTEP_RETURN_IF_ERROR(SameResolutionsEverywhere(group));
  Trained run;
  OPTSTEP_ASSIGN_OR_RETURN(run.stepped, testutil::Pulled(*trainer, stepped.session_id()));
  OPTSTEP_ASSIGN_OR_RETURN(run.fresh, testutil::Pulled(*trainer, fresh.session_id()));
  return run;
}

// Run for rank 1 and for rank 0 (which heals itself in), the parameter: the rank killed.
class KilledRankTest : public ::testing::TestWithParam<int> {};

TEST_P(KilledRankTest, ARankRestartedBetweenStepsRejoinsAndTrainingEndsBitIdentical) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group reference_group, testutil::StartGroup(kWorld, kFlags));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Trained reference, Train(reference_group, /*dead=*/-1));
  reference_group.clear();

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Trained healed, Train(group, /*dead=*/GetParam()));
  EXPECT_EQ(healed.stepped, reference.stepped);
  EXPECT_EQ(healed.fresh, reference.fresh);
  // The survivors never left (an exit for a restart would have restarted nobody here): the same
  // processes serve, and the restarted one with them. The group has no --checkpoint_root, so a
  // restarted rank 0 had its sessions from the heal alone.
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

TEST_P(KilledRankTest, ARankKilledMidStepRejoinsAndTheStepIsRedone) {
  const int dead = GetParam();
  constexpr uint64_t kSteps = 5;
  constexpr uint64_t kKilledStep = 3;
  // Rank `dead` kills itself in the kSteps + kKilledStep-th step it takes: step kKilledStep of
  // the second session, after the first session's kSteps.
  std::vector<std::string> dying = kFlags;
  dying.push_back(absl::StrCat("--kill_before_allgather=", kSteps + kKilledStep));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroupWith(kWorld, [&](int r) {
                                 return r == dead ? dying : kFlags;
                               }));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, kSteps));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo killed,
                               trainer->CreateSession(SpreadSpec("killed")));
  for (uint64_t step = 1; step < kKilledStep; ++step) {
    ASSERT_THAT(StepSpread(*trainer, killed.session_id(), step).status(), IsOk());
  }
  // The trainer's step: its recovery waits for the group and redoes it (no rollback: a Step
  // answers ABORTED with the step to rewind to after one).
  absl::StatusOr<StepReply> redone = absl::UnknownError("not run");
  std::thread step([&] { redone = StepSpread(*trainer, killed.session_id(), kKilledStep); });
  const int status = group[dead]->Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (int r = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    EXPECT_TRUE(AwaitHealth(*group[r], false, absl::Seconds(10))) << "rank " << r;
  }
  // Longer than a survivor takes to exit for a restart (--peer_loss_exit_grace_ms, 1 s): they
  // wait for the rank instead.
  absl::SleepFor(absl::Seconds(2));
  for (int r = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    EXPECT_TRUE(Live(*group[r])) << "rank " << r << " left the group";
  }
  ASSERT_THAT(Restart(group, dead, kFlags), IsOk());
  step.join();
  ASSERT_THAT(redone.status(), IsOk());
  EXPECT_EQ(redone->step, kKilledStep);
  for (uint64_t s = kKilledStep + 1; s <= kSteps; ++s) {
    ASSERT_THAT(StepSpread(*trainer, killed.session_id(), s).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), killed.session_id()), IsOk())
      << "after the redone step";
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Rank, KilledRankTest, ::testing::Values(1, 0),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Rank", info.param);
                         });

// A restarted rank killed again while it heals in (it SIGKILLs itself, --kill_during_heal: at its
// first rendezvous, where the others wait for it, or once it fetched its first state dict from a
// peer) costs the group nothing but time: the heal fails (the others' rendezvous gives up once
// they count it lost), no rank exits for a restart of the group, and the rank's next process
// heals in. The trainer's step taken meanwhile waits and is applied once, never rewound, and the
// run ends bit for bit with an undisturbed session. Rank 0 is the heal's coordinator for rank 1,
// and heals itself in.
struct KilledWhileHealing {
  int dead;
  const char* moment;  // --kill_during_heal
};
class KilledWhileHealingTest : public ::testing::TestWithParam<KilledWhileHealing> {};

TEST_P(KilledWhileHealingTest, ARankKilledWhileItHealsInHealsOnItsNextRestart) {
  const int dead = GetParam().dead;
  constexpr uint64_t kSteps = 4;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, kSteps));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo healed,
                               trainer->CreateSession(SpreadSpec("healed")));
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(StepSpread(*trainer, healed.session_id(), step).status(), IsOk());
  }
  group[dead]->SignalAndWait(SIGKILL);
  for (int r = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    ASSERT_TRUE(AwaitHealth(*group[r], false, absl::Seconds(10))) << "rank " << r;
  }
  std::vector<std::string> dying = kFlags;
  dying.push_back(absl::StrCat("--kill_during_heal=", GetParam().moment));
  ASSERT_THAT(Restart(group, dead, dying), IsOk());
  const int status = group[dead]->WaitFor(absl::Seconds(60));
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  absl::StatusOr<StepReply> waited = absl::UnknownError("not run");
  std::thread step([&] { waited = StepSpread(*trainer, healed.session_id(), 3); });
  // Longer than the heal takes to fail (the peer timeout, 1 s, and a slice of the rendezvous's
  // wait) and a rank then to exit for a restart (--peer_loss_exit_grace_ms, 1 s): they wait for
  // the rank instead. (A rank that exits later still fails the checks at the end.)
  absl::SleepFor(absl::Seconds(4));
  for (int r = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    EXPECT_TRUE(Live(*group[r])) << "rank " << r << " left the group";
  }
  ASSERT_THAT(Restart(group, dead, kFlags), IsOk());
  step.join();
  ASSERT_THAT(waited.status(), IsOk());
  EXPECT_EQ(waited->step, 3u);
  ASSERT_THAT(StepSpread(*trainer, healed.session_id(), kSteps).status(), IsOk());
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), healed.session_id()), IsOk())
      << "after the second heal";
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    RankAndMoment, KilledWhileHealingTest,
    ::testing::Values(KilledWhileHealing{1, "rendezvous"}, KilledWhileHealing{1, "transfer"},
                      KilledWhileHealing{0, "rendezvous"}, KilledWhileHealing{0, "transfer"}),
    [](const ::testing::TestParamInfo<KilledWhileHealing>& info) {
      return absl::StrCat(
          "Rank", info.param.dead, "_",
          info.param.moment == std::string("rendezvous") ? "AtItsRendezvous" : "InItsTransfer");
    });

// A rolling restart, as a StatefulSet's RollingUpdate runs it: each rank in turn, the highest
// ordinal first and rank 0 last, is shut down on purpose (SIGTERM: it leaves the group, and the
// others count it as gone) and started again with its ordinal on its port, once the group serves
// again. Each comes back healed into the running group: the trainer steps between the restarts,
// never rewinds, and the run ends with the parameters and optimizer state of an undisturbed
// session, bit for bit; no survivor ever exits.
TEST(RejoinTest, ARollingRestartOfEveryRankLosesNoStep) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  constexpr uint64_t kSteps = kWorld + 2;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, kSteps));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo rolled,
                               trainer->CreateSession(SpreadSpec("rolled")));
  ASSERT_THAT(StepSpread(*trainer, rolled.session_id(), 1).status(), IsOk());
  uint64_t step = 2;
  for (int rank = kWorld - 1; rank >= 0; --rank) {
    EXPECT_EQ(group[rank]->SignalAndWait(SIGTERM), 0) << "rank " << rank;
    ASSERT_THAT(Restart(group, rank, kFlags), IsOk());
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(30)))
          << "rank " << r << " is not SERVING after rank " << rank << " restarted";
    }
    OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, StepSpread(*trainer, rolled.session_id(), step));
    EXPECT_EQ(reply.step, step) << "after rank " << rank << " restarted";
    ++step;
  }
  for (; step <= kSteps; ++step) {
    ASSERT_THAT(StepSpread(*trainer, rolled.session_id(), step).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), rolled.session_id()), IsOk())
      << "after the rolling restart";
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

// A step's resolution begun on one rank alone (`begun_on`, which waits for the others in the
// collectives) when rank `dead` is lost: the ranks' counts of resolutions differ.
struct CutResolution {
  int begun_on;
  int dead;
};
class CutResolutionTest : public ::testing::TestWithParam<CutResolution> {};

TEST_P(CutResolutionTest, ALossThatCutsAStepOnSomeRanksOnlyLeavesOneCountOfResolutions) {
  const auto [begun_on, dead] = GetParam();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SpreadSpec("cut")));
  const std::string& id = info.session_id();
  ASSERT_THAT(StepSpread(*trainer, id, 1).status(), IsOk());
  // Step 2 reaches one rank alone: it begins resolving it; the other ranks never begin it
  // before the loss.
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(group[begun_on]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  v1::StepRequest request;
  request.mutable_header()->set_session_id(id);
  request.mutable_header()->set_step(2);
  ASSERT_TRUE(stream->Write(request));
  const std::vector<std::vector<float>> grads = SpreadGradients(2);
  for (int p = 0; p < kSpreadParams; ++p) {
    if (info.layout().owner(p) != static_cast<uint32_t>(begun_on)) continue;
    request.Clear();
    v1::TensorChunk* chunk = request.mutable_gradient();
    chunk->set_param_id(p);
    chunk->set_dtype(v1::DTYPE_FP32);
    chunk->set_data(grads[p].data(), grads[p].size() * sizeof(float));
    ASSERT_TRUE(stream->Write(request));
  }
  request.Clear();
  request.mutable_commit();
  ASSERT_TRUE(stream->Write(request));
  absl::SleepFor(absl::Milliseconds(500));
  std::vector<pid_t> survivors;
  for (int r = 0; r < kWorld; ++r) {
    if (r != dead) survivors.push_back(group[r]->pid());
  }
  group[dead]->SignalAndWait(SIGKILL);
  ASSERT_THAT(Restart(group, dead, kFlags), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  // Healed in, not restarted as a group: the survivors' processes still run (a restarted rank 0
  // used to refuse survivors whose counts differed).
  for (int r = 0, s = 0; r < kWorld; ++r) {
    if (r == dead) continue;
    EXPECT_EQ(group[r]->pid(), survivors[s++]) << "rank " << r;
  }
  context.TryCancel();
  // The trainer redoes step 2 on every rank; the ranks count one number of resolutions, so a
  // hold settles them all (before, rank 0 counted the cut resolution twice and a checkpoint
  // waited for the others to reach its count).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply redone, StepSpread(*trainer, id, 2));
  EXPECT_EQ(redone.step, 2u);
  ASSERT_THAT(StepSpread(*trainer, id, 3).status(), IsOk());
  EXPECT_THAT(SameResolutionsEverywhere(group), IsOk());
}

INSTANTIATE_TEST_SUITE_P(Loss, CutResolutionTest,
                         // {0, 2}: rank 0, which coordinates the heal, waits in the
                         // collective on rank 1, which never began the step.
                         ::testing::Values(CutResolution{0, 1}, CutResolution{1, 0},
                                           CutResolution{0, 2}),
                         [](const ::testing::TestParamInfo<CutResolution>& info) {
                           return absl::StrCat("BegunOnRank", info.param.begun_on, "_Rank",
                                               info.param.dead, "Lost");
                         });

// A session's state imported (every rank's shadow fetched again after it), then rank kDead lost
// and restarted: it heals from its buddy's shadow, and the session steps on as the one the state
// came from. The group runs with `flags`.
void ImportKillAndHeal(const std::vector<std::string>& flags) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference,
                               trainer->CreateSession(SpreadSpec("reference")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo imported,
                               trainer->CreateSession(SpreadSpec("imported")));
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(StepSpread(*trainer, reference.session_id(), step).status(), IsOk());
  }
  // The reference's state after step 2, imported into the other session.
  v1::ExportStateDictRequest request;
  request.set_session_id(reference.session_id());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Client::StateDictEntry> state,
                               trainer->ExportStateDict(request));
  ASSERT_THAT(trainer->ImportStateDict(imported.session_id(), state), IsOk());
  group[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  ASSERT_THAT(Restart(group, kDead, flags), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  for (uint64_t step = 3; step <= 4; ++step) {
    ASSERT_THAT(StepSpread(*trainer, reference.session_id(), step).status(), IsOk());
    ASSERT_THAT(StepSpread(*trainer, imported.session_id(), step).status(), IsOk());
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string expected, StateOf(*trainer, reference.session_id()));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string healed, StateOf(*trainer, imported.session_id()));
  EXPECT_TRUE(healed == expected) << "the state after the heal differs";
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Live(*group[r])) << "rank " << r;
}

TEST(RejoinTest, ARankLostAfterAStateImportHeals) { ImportKillAndHeal(kFlags); }

// The same with the first call that has rank kDead's buddy fetch its shadow again lost on the
// way (a connection reset): it is made again. Before, it was made once, the buddy's shadow stayed
// stale, and the heal of rank kDead was refused: the group restarted.
TEST(RejoinTest, AShadowRefreshLostOnTheWayIsMadeAgain) {
  std::vector<std::string> flags = kFlags;
  flags.push_back(absl::StrCat("--drop_first_peer_call=RefreshShadow:", (kDead + 1) % kWorld));
  ImportKillAndHeal(flags);
}

TEST(RejoinTest, TwoRanksLostAtOnceRestartTheGroup) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  group[1]->Signal(SIGKILL);
  group[2]->Signal(SIGKILL);
  // Rank 0 waits for no rejoin: it exits for its supervisor to restart the group.
  const int status = group[0]->Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 75);
}

// Whether `rank`'s process exited within `wait` with status 75 (it is reaped then).
bool ExitsForRestart(ServerProcess& rank, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  siginfo_t info{};
  while (absl::Now() < deadline) {
    info.si_pid = 0;
    if (waitid(P_PID, rank.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) {
      const int status = rank.Wait();
      return WIFEXITED(status) && WEXITSTATUS(status) == 75;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// A rank that dies in every heal (out of memory each time) is waited for three heals in a row;
// then the group restarts as a whole rather than heal it for ever.
TEST(RejoinTest, ARankLostInEveryHealRestartsTheGroupAfterThree) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->CreateSession(SpreadSpec("doomed")).status(), IsOk());
  group[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  std::vector<std::string> dying = kFlags;
  dying.push_back("--kill_during_heal=transfer");
  for (int heal = 1; heal <= 4; ++heal) {
    ASSERT_THAT(Restart(group, kDead, dying), IsOk());
    const int status = group[kDead]->WaitFor(absl::Seconds(60));
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "heal " << heal;
    if (heal == 3) {
      absl::SleepFor(absl::Seconds(2));  // longer than a rank takes to exit for a restart
      for (int r = 0; r < kWorld; ++r) {
        if (r == kDead) continue;
        EXPECT_TRUE(Running(*group[r])) << "rank " << r << " after three heals";
      }
    }
  }
  EXPECT_TRUE(ExitsForRestart(*group[0], absl::Seconds(30)));
}

// Rank 0 reports SERVING only once every rank was told that the group formed (the answer to its
// next heartbeat, two seconds apart here): a rank 0 lost the moment it serves heals itself in.
// Before, it served at once, and the other ranks, which had not been told yet, took its loss for
// one before the group formed: they exited, and the group restarted, trainers' steps since
// rewound to the automatic checkpoints.
TEST(RejoinTest, ARankZeroLostAsSoonAsItServesHealsItselfIn) {
  const std::vector<std::string> flags = {"--heartbeat_interval_ms=2000", "--peer_timeout_ms=6000",
                                          "--state_redundancy=1", "--rejoin_timeout_ms=60000"};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(30)));
  group[0]->SignalAndWait(SIGKILL);
  ASSERT_THAT(Restart(group, 0, flags), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(60))) << "rank " << r;
  }
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_TRUE(Running(*group[r])) << "rank " << r << " exited for a restart of the group";
  }
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SpreadSpec("after")));
  EXPECT_THAT(StepSpread(*trainer, info.session_id(), 1).status(), IsOk());
}

TEST(RejoinTest, RankZeroRestartedTogetherWithAnotherRankRestartsTheGroup) {
  // A short group timeout: the new rank 0 waits that long at most for a rank that left.
  std::vector<std::string> flags = kFlags;
  flags.push_back("--comm_timeout_ms=5000");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  ASSERT_THAT(trainer->CreateSession(SmallSpec("kept")).status(), IsOk());
  // The other ranks learn that the group formed (they would wait for rank 0 only then).
  absl::SleepFor(absl::Seconds(1));
  group[0]->SignalAndWait(SIGKILL);
  group[2]->SignalAndWait(SIGKILL);
  ASSERT_THAT(Restart(group, 0, flags), IsOk());
  ASSERT_THAT(Restart(group, 2, flags), IsOk());
  // Rank 1 lost two ranks; rank 0 finds rank 1 waiting for it and rank 2 new (or rank 1 gone):
  // it cannot heal itself in, and every rank exits for its supervisor to restart the group.
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(ExitsForRestart(*group[r], absl::Seconds(30))) << "rank " << r;
  }
  // As the supervisor does: every rank again, the group new.
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(Restart(group, r, flags), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  EXPECT_THAT(trainer->CreateSession(SmallSpec("new")).status(), IsOk());
}

// A heal that takes longer than --comm_timeout_ms (the restarted rank pauses a second after each
// state dict it fetched, six of them) completes: the calls that wait while a heal moves state
// (rank 0's transfer and catch-up phases, the restarted rank's Rejoin) last while the peer
// answers its pings, not up to a deadline. The trainer's step waits and is applied once; the run
// ends bit for bit with an undisturbed session, and no rank exits.
TEST(RejoinTest, AHealLongerThanTheCommunicatorTimeoutCompletes) {
  std::vector<std::string> flags = kFlags;
  flags.push_back("--comm_timeout_ms=3000");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, 3));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo healed,
                               trainer->CreateSession(SpreadSpec("healed")));
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(StepSpread(*trainer, healed.session_id(), step).status(), IsOk());
  }
  group[1]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  std::vector<std::string> slow = flags;
  slow.push_back("--delay_heal_fetch_ms=1000");
  ASSERT_THAT(Restart(group, 1, slow), IsOk());
  const absl::Time restarted = absl::Now();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply third, StepSpread(*trainer, healed.session_id(), 3));
  EXPECT_EQ(third.step, 3u);
  EXPECT_GT(absl::Now() - restarted, absl::Seconds(3)) << "the heal did not outlast the timeout";
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), healed.session_id()),
              IsOk());
  // Longer than a rank takes to exit for a restart of the group after a failed heal
  // (--peer_loss_exit_grace_ms, 1 s).
  absl::SleepFor(absl::Seconds(2));
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Running(*group[r])) << "rank " << r;
}

}  // namespace
}  // namespace optstep
