// Self-healing through automatic checkpoints (real server processes on loopback, Gloo between
// them): a group saving every step is SIGKILLed whole and started again on the same checkpoint
// root; rank 0 restores the session with its id and its last saved step before it turns
// SERVING, and stepping on ends bit for bit where an undisturbed group ends, also when the group
// comes back with another number of ranks (one, two or three). A session closed by its owner loses
// its automatic checkpoints; a user's Save may not take the reserved name. A rank whose peer is
// SIGKILLed exits with status 75 for its supervisor to restart the group, also when rank 0 dies
// while it restores the group.

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/auto_checkpoint_run.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

namespace fs = std::filesystem;
using ::optstep::testutil::AutoFlags;
using ::optstep::testutil::AwaitAutoCheckpoint;
using ::optstep::testutil::CreateWithRequestId;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Pulled;
using ::optstep::testutil::Running;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StartGroup;
using ::optstep::testutil::StartGroupWith;
using ::optstep::testutil::StartRunning;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepRange;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::TempDir;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// Steps before the group is killed, and after it is back.
constexpr uint64_t kBefore = 4;
constexpr uint64_t kAfter = 3;

// The parameters after kBefore + kAfter steps of an undisturbed group.
std::string Reference() {
  absl::StatusOr<Running> run = StartRunning(2, {});
  EXPECT_THAT(run.status(), IsOk());
  if (!run.ok()) return "";
  absl::StatusOr<v1::SessionInfo> info = run->client->CreateSession(SmallSpec("auto"));
  EXPECT_THAT(info.status(), IsOk());
  if (!info.ok()) return "";
  EXPECT_THAT(StepRange(*run->client, info->session_id(), 1, kBefore + kAfter), IsOk());
  absl::StatusOr<std::string> pulled = Pulled(*run->client, info->session_id());
  EXPECT_THAT(pulled.status(), IsOk());
  return pulled.ok() ? *pulled : "";
}

constexpr char kAutoRequestId[] = "auto-checkpoint-test";

// Two ranks saving every step: a session "auto" (made with kAutoRequestId) steps kBefore times,
// each step's checkpoint awaited so that every step is saved; `before_kill` (may be null) sees the
// session, then the group is SIGKILLed whole. Answers the session's id.
absl::StatusOr<std::string> SaveEachStepThenKill(
    const std::string& root,
    const std::function<void(const std::string& session)>& before_kill = nullptr) {
  OPTSTEP_ASSIGN_OR_RETURN(Running run, StartRunning(2, AutoFlags(root)));
  OPTSTEP_ASSIGN_OR_RETURN(
      v1::CreateSessionResponse created,
      CreateWithRequestId(run.group[0]->address(), SmallSpec("auto"), kAutoRequestId));
  const std::string session = created.summary().session_id();
  for (uint64_t step = 1; step <= kBefore; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*run.client, session, step).status());
    OPTSTEP_RETURN_IF_ERROR(AwaitAutoCheckpoint(root, session, step));
  }
  if (before_kill) before_kill(session);
  for (auto& rank : run.group) rank->Signal(SIGKILL);
  for (auto& rank : run.group) rank->Wait();
  return session;
}

class AutoRestoreTest : public ::testing::TestWithParam<int> {};

TEST_P(AutoRestoreTest, AGroupKilledWholeComesBackWithItsSessionAndContinuesBitForBit) {
  const int restarted_world = GetParam();
  const std::string reference = Reference();
  ASSERT_FALSE(reference.empty());
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string session,
                               SaveEachStepThenKill(root.path(), [&](const std::string& session) {
                                 // Only the newest two (--keep_auto_checkpoints' default) are kept:
                                 // the older ones go once the newest is committed.
                                 const fs::path saved = fs::path(root.path()) / "auto" / session;
                                 for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
                                      fs::exists(saved / "step-2") && absl::Now() < give_up;) {
                                   absl::SleepFor(absl::Milliseconds(20));
                                 }
                                 EXPECT_FALSE(fs::exists(saved / "step-1"));
                                 EXPECT_FALSE(fs::exists(saved / "step-2"));
                                 EXPECT_TRUE(fs::exists(saved / "step-3" / "manifest.json"));
                               }));

  // Restarted without automatic checkpoints: the session comes back all the same.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run,
                               StartRunning(restarted_world, {"--checkpoint_root=" + root.path()}));
  // SERVING already: the session is there, with its id, name and last saved step.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session));
  EXPECT_EQ(info.step(), kBefore);
  EXPECT_EQ(info.spec().name(), "auto");
  // Creating it by name attaches to the restored session; the creation that made it, retried with
  // its request id, is answered as it was (the record keeps the request id).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo again, run.client->CreateSession(SmallSpec("auto")));
  EXPECT_EQ(again.session_id(), session);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      v1::CreateSessionResponse retried,
      CreateWithRequestId(run.group[0]->address(), SmallSpec("auto"), kAutoRequestId));
  EXPECT_EQ(retried.summary().session_id(), session);
  EXPECT_FALSE(retried.attached());
  ASSERT_THAT(StepRange(*run.client, session, kBefore + 1, kBefore + kAfter), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, Pulled(*run.client, session));
  EXPECT_TRUE(pulled == reference) << "parameters differ from the undisturbed run";

  // Closed by its owner: its automatic checkpoints go with it (right after a save that runs).
  ASSERT_THAT(run.client->CloseSession(session), IsOk());
  const fs::path saved = fs::path(root.path()) / "auto" / session;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
       fs::exists(saved) && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(fs::exists(saved));
}

INSTANTIATE_TEST_SUITE_P(RestartedOn, AutoRestoreTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return absl::StrCat(info.param, "Ranks"); });

// A group killed whole after kBefore steps, each saved, restarted with `--kill_during_restore`
// on rank `killed` (rank 0: once the session is recreated on every rank, before it loads;
// another rank: as its replica is made).
class InterruptedRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    reference_ = Reference();
    ASSERT_FALSE(reference_.empty());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(session_, SaveEachStepThenKill(root_.path()));
  }

  absl::StatusOr<Group> RestartKilling(int killed) {
    return StartGroupWith(2, [&](int rank) {
      std::vector<std::string> flags = {"--checkpoint_root=" + root_.path(),
                                        "--heartbeat_interval_ms=100", "--peer_timeout_ms=1000",
                                        "--comm_timeout_ms=10000"};
      if (rank == killed) flags.push_back("--kill_during_restore");
      return flags;
    });
  }

  // Restarts the group with rank `killed` dying in the restore: it must die by SIGKILL, and the
  // other rank exit for a restart (75) within `bound` (`why` it did not, otherwise).
  void ExpectKilledAndTheOtherExits(int killed, absl::Duration bound, const std::string& why) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, RestartKilling(killed));
    const int dead = group[killed]->WaitFor(absl::Seconds(30));
    ASSERT_NE(dead, -1) << "rank " << killed << " did not die in the restore";
    EXPECT_TRUE(WIFSIGNALED(dead) && WTERMSIG(dead) == SIGKILL);
    const int other = group[1 - killed]->WaitFor(bound);
    ASSERT_NE(other, -1) << why;
    ASSERT_TRUE(WIFEXITED(other));
    EXPECT_EQ(WEXITSTATUS(other), 75);
  }

  // Started again, the group restores the session from the same checkpoints, untouched, and
  // steps on bit for bit.
  void ExpectRestoredAndSteppedOn() {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run,
                                 StartRunning(2, {"--checkpoint_root=" + root_.path()}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session_));
    EXPECT_EQ(info.step(), kBefore);
    ASSERT_THAT(StepRange(*run.client, session_, kBefore + 1, kBefore + kAfter), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, Pulled(*run.client, session_));
    EXPECT_TRUE(pulled == reference_) << "parameters differ from the undisturbed run";
  }

  TempDir root_;
  std::string reference_;
  std::string session_;
};

// Rank 0 lost while it restores the group: the group had not formed, so rank 1 does not wait for
// rank 0's next process but exits for a restart of the whole group.
TEST_F(InterruptedRestoreTest, RankZeroKilledWhileItRestoresRestartsTheGroupAndLosesNothing) {
  // The peer timeout, the grace of one second, and room for a loaded machine.
  ExpectKilledAndTheOtherExits(0, absl::Seconds(15),
                               "rank 1 waits for a rank 0 that never formed the group");
  ExpectRestoredAndSteppedOn();
}

// Rank 1 lost while rank 0 restores the group: rank 0 does not serve on without the session,
// which a rank 1 restarted by its supervisor would heal into and never get, but exits for a
// restart of the whole group.
TEST_F(InterruptedRestoreTest, ARankLostWhileRankZeroRestoresRestartsTheGroupAndLosesNothing) {
  // Well within the rejoin timeout (60 s), which a group that serves waits out.
  ExpectKilledAndTheOtherExits(1, absl::Seconds(20),
                               "rank 0 serves on without the session it could not restore");
  ExpectRestoredAndSteppedOn();
}

// SIGKILLs every rank of `run` and waits for them.
void KillWhole(Running& run) {
  for (auto& rank : run.group) ::kill(rank->pid(), SIGKILL);
  for (auto& rank : run.group) rank->Wait();
}

// A session `name` of one rank saving every step, stepped through `steps` steps, each saved, and
// then the rank SIGKILLed: its id.
absl::StatusOr<std::string> SavedThenKilled(const std::string& root, const std::string& name,
                                            uint64_t steps) {
  OPTSTEP_ASSIGN_OR_RETURN(Running run, StartRunning(1, AutoFlags(root)));
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, run.client->CreateSession(SmallSpec(name)));
  for (uint64_t step = 1; step <= steps; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*run.client, info.session_id(), step).status());
    OPTSTEP_RETURN_IF_ERROR(AwaitAutoCheckpoint(root, info.session_id(), step));
  }
  KillWhole(run);
  return info.session_id();
}

// The newest checkpoint is the one of the highest step, not the one written last: a copy or a
// restore of the files may leave an older step's manifest with the later modification time.
TEST(AutoRestoreOrderTest, TheHighestStepIsRestoredWhateverTheManifestTimes) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string session, SavedThenKilled(root.path(), "order", 3));
  const fs::path older = fs::path(root.path()) / "auto" / session / "step-2" / "manifest.json";
  ASSERT_TRUE(fs::exists(older));
  fs::last_write_time(older, fs::file_time_type::clock::now() + std::chrono::hours(1));

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path()}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session));
  EXPECT_EQ(info.step(), 3u);
}

// A newest automatic checkpoint damaged on disk: the restore falls back to the one before and
// sets the damaged one aside, so that the session saves that step again. Left in place, it passed
// for its step saved, and every later restart fell back past it once more.
TEST(AutoRestoreFallbackTest, ADamagedNewestCheckpointIsSetAsideAndItsStepSavedAgain) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string session,
                               SavedThenKilled(root.path(), "damaged", 3));
  const fs::path dir = fs::path(root.path()) / "auto" / session;
  fs::resize_file(dir / "step-3" / "shard-0-of-1.safetensors", 100);  // truncated
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, AutoFlags(root.path())));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session));
    EXPECT_EQ(info.step(), 2u);
    EXPECT_FALSE(fs::exists(dir / "step-3"));
    EXPECT_TRUE(fs::exists(dir / ".step-3.unusable"));
    ASSERT_THAT(StepSmall(*run.client, session, 3).status(), IsOk());
    ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 3), IsOk());
    KillWhole(run);
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path()}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session));
  EXPECT_EQ(info.step(), 3u) << "the restore fell back past step 3 again";
}

// The record beside a session's automatic checkpoints, left empty by a crash before it reached
// the disk, is written again at the next save: the session is still restored.
TEST(AutoCheckpointRecordTest, ARecordLeftEmptyIsWrittenAgain) {
  TempDir root;
  std::string session;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, AutoFlags(root.path())));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info,
                                 run.client->CreateSession(SmallSpec("record")));
    session = info.session_id();
    ASSERT_THAT(StepSmall(*run.client, session, 1).status(), IsOk());
    ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 1), IsOk());
    std::ofstream(fs::path(root.path()) / "auto" / session / "session.json", std::ios::trunc);
    ASSERT_THAT(StepSmall(*run.client, session, 2).status(), IsOk());
    ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 2), IsOk());
    KillWhole(run);
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path()}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->GetSession(session));
  EXPECT_EQ(info.step(), 2u);
}

// A closed session's automatic checkpoints are hidden before they are removed; what a crash
// left of them hidden goes at the next start, and is never restored.
TEST(AutoCheckpointCloseTest, WhatAClosedSessionLeftHiddenGoesAtTheNextStart) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string session,
                               SavedThenKilled(root.path(), "closed", 1));
  const fs::path autos = fs::path(root.path()) / "auto";
  fs::rename(autos / session, autos / ("." + session + ".closed"));  // as a crash left it
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path()}));
  EXPECT_THAT(run.client->GetSession(session).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(fs::exists(autos / ("." + session + ".closed")));
}

// The temporary of a save cut short (its rank 0 lost, and healed back in: no restore runs) goes
// at the session's next save once it is idle past --checkpoint_temp_max_age_ms, not only when
// the group restarts.
TEST(AutoCheckpointTemporaryTest, AStaleTemporaryGoesAtTheNextSave) {
  TempDir root;
  std::vector<std::string> flags = AutoFlags(root.path());
  flags.push_back("--checkpoint_temp_max_age_ms=60000");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, flags));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("tmp")));
  const std::string session = info.session_id();
  ASSERT_THAT(StepSmall(*run.client, session, 1).status(), IsOk());
  ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 1), IsOk());
  const fs::path dir = fs::path(root.path()) / "auto" / session;
  const fs::path stale = dir / ".step-7.tmp", fresh = dir / ".step-8.tmp";
  for (const fs::path& tmp : {stale, fresh}) {
    fs::create_directories(tmp);
    std::ofstream(tmp / "shard-0-of-1.safetensors") << "partial";
  }
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(stale / "shard-0-of-1.safetensors", old);
  fs::last_write_time(stale, old);
  ASSERT_THAT(StepSmall(*run.client, session, 2).status(), IsOk());
  ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 2), IsOk());
  EXPECT_FALSE(fs::exists(stale)) << "the idle temporary stayed";
  EXPECT_TRUE(fs::exists(fresh)) << "a temporary that may be a save in progress went";
}

// A crashed save's temporary in the root, still young when the server started (a restarted rank
// 0 heals in seconds after the crash), goes at the next Save once it is idle past the bound.
// Before, only a start swept the root, and each crash kept most of a checkpoint on the disk
// until the group happened to start again.
TEST(CheckpointTemporaryTest, AStaleTemporaryIsSweptBeforeASave) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running run,
      StartRunning(1, {"--checkpoint_root=" + root.path(), "--checkpoint_temp_max_age_ms=60000"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("swp")));
  ASSERT_THAT(StepSmall(*run.client, info.session_id(), 1).status(), IsOk());
  const fs::path stale = fs::path(root.path()) / ".big.12345.tmp";
  const fs::path fresh = fs::path(root.path()) / ".big.67890.tmp";
  for (const fs::path& tmp : {stale, fresh}) {
    fs::create_directories(tmp);
    std::ofstream(tmp / "shard-0-of-2.safetensors") << "partial";
  }
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(stale / "shard-0-of-2.safetensors", old);
  fs::last_write_time(stale, old);
  ASSERT_THAT(run.client->Save(info.session_id(), "ck").status(), IsOk());
  EXPECT_FALSE(fs::exists(stale)) << "the idle temporary stayed";
  EXPECT_TRUE(fs::exists(fresh)) << "a temporary that may be a save in progress went";
}

TEST(AutoCheckpointScheduleTest, BySecondsASessionIsSavedAfterItsFirstStepAndOnceTheTimePassed) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path(),
                                                             "--checkpoint_every_seconds=0.3"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("t")));
  const std::string session = info.session_id();
  ASSERT_THAT(StepRange(*run.client, session, 1, 1), IsOk());
  ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 1), IsOk());  // its first step
  ASSERT_THAT(StepRange(*run.client, session, 2, 3), IsOk());
  // Not by steps (--checkpoint_every_steps is 0): 0.3 s after the last save.
  EXPECT_THAT(AwaitAutoCheckpoint(root.path(), session, 3), IsOk());
}

// A disk that fails the automatic checkpoints (here the session's directory cannot be made: a file
// is in its place) costs no step: each failed attempt is counted for an alert, and once the disk
// is back the next step is saved.
TEST(AutoCheckpointFailureTest, AFailedSaveIsCountedAndTheSessionGoesOn) {
  TempDir root;
  std::vector<std::string> flags = AutoFlags(root.path());
  flags.push_back("--metrics_port=-1");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, flags));
  const int metrics = run.group[0]->metrics_port();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("f")));
  const std::string session = info.session_id();
  const fs::path directory = fs::path(root.path()) / "auto" / session;
  fs::remove_all(directory);
  fs::create_directories(directory.parent_path());
  std::ofstream(directory) << "not a directory";
  ASSERT_THAT(StepRange(*run.client, session, 1, 1), IsOk());
  // Tried again every second while the disk is broken: at least once by now.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (testutil::ScrapeMetrics(metrics)["optstep_auto_checkpoint_failures_total"] < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(testutil::ScrapeMetrics(metrics)["optstep_auto_checkpoint_failures_total"], 1);
  fs::remove(directory);
  ASSERT_THAT(StepRange(*run.client, session, 2, 2), IsOk());
  EXPECT_THAT(AwaitAutoCheckpoint(root.path(), session, 2), IsOk());
  EXPECT_THAT(testutil::AwaitMetric(metrics, "optstep_auto_checkpoints_total", 1), IsOk());
}

TEST(AutoCheckpointNameTest, AUserSaveMayNotTakeTheReservedName) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, {"--checkpoint_root=" + root.path()}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("n")));
  EXPECT_THAT(run.client->Save(info.session_id(), "auto").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved for automatic checkpoints"));
  EXPECT_THAT(run.client->Save(info.session_id(), "auto/x/step-1").status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// Rank 0's part of step `step` of a SmallSpec session (the parameters it owns, zero gradients),
// by hand; answers the stream's status.
grpc::Status StepOnRank0(const ServerProcess& rank0, const v1::SessionInfo& info, uint64_t step) {
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(rank0.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->Step(&context);
  v1::StepRequest request;
  request.mutable_header()->set_session_id(info.session_id());
  request.mutable_header()->set_step(step);
  stream->Write(request);
  uint64_t elements = 0;
  for (int p = 0; p < info.spec().parameters_size(); ++p) {
    if (info.layout().owner(p) != 0) continue;
    uint64_t n = 1;
    for (uint64_t d : info.spec().parameters(p).shape()) n *= d;
    request.Clear();
    request.mutable_gradient()->set_param_id(p);
    request.mutable_gradient()->set_dtype(v1::DTYPE_FP32);
    request.mutable_gradient()->set_data(std::string(n * sizeof(float), '\0'));
    stream->Write(request);
    elements += n;
  }
  request.Clear();
  request.mutable_commit()->set_num_elements(elements);
  stream->Write(request);
  stream->WritesDone();
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

TEST(ExitOnPeerLossTest, ARankWhosePeerIsKilledExitsWithStatus75) {
  // Without redundancy nothing waits for the rank to rejoin (rejoin_test has the other case).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running run, StartRunning(2, {"--heartbeat_interval_ms=100", "--peer_timeout_ms=1000",
                                    "--state_redundancy=0"}));
  const absl::Time killed = absl::Now();
  run.group[1]->SignalAndWait(SIGKILL);
  // The timeout, the grace of one second, and room for a loaded machine.
  const int status = run.group[0]->WaitFor(absl::Seconds(15));
  ASSERT_NE(status, -1) << "rank 0 still runs";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 75);
  EXPECT_GE(absl::Now() - killed, absl::Seconds(1));
}

TEST(ExitOnPeerLossTest, ARankWhoseSessionLostItsGroupExitsWithStatus75) {
  // Heartbeats that would take ten minutes to notice: the failed collective tells first. Without
  // redundancy the session is broken (with it, only interrupted: rejoin_test waits for the heal).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running run, StartRunning(2, {"--heartbeat_interval_ms=100", "--peer_timeout_ms=600000",
                                    "--state_redundancy=0"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("g")));
  ASSERT_THAT(StepSmall(*run.client, info.session_id(), 1).status(), IsOk());
  run.group[1]->SignalAndWait(SIGKILL);
  // Rank 0's part of step 2 arrives; its collectives with the dead rank fail.
  (void)StepOnRank0(*run.group[0], info, 2);
  const int status = run.group[0]->WaitFor(absl::Seconds(15));
  ASSERT_NE(status, -1) << "rank 0 still runs";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 75);
}

}  // namespace
}  // namespace optstep
