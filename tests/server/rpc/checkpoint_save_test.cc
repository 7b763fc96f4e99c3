// Save through the real services, engine and a fault-injecting CPU device in process: a save that
// fails halfway (the device fails a copy of a tensor to the host) leaves nothing in the checkpoint
// root, the next save of the same name succeeds, and names that are unsafe are refused naming
// the name escaped, before any file is touched. And the automatic restore from such checkpoints:
// a load that fails for a passing reason is tried again, one that finds damage falls back.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_factory.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/auto_checkpoint.h"
#include "server/rpc/auto_restore.h"
#include "server/rpc/caller_calls.h"
#include "server/rpc/server.h"
#include "tests/integration/test_session.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testutil::DirectoryEntries;

class CheckpointSaveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/checkpoints-", ++counter);
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    DeviceOptions device_options;
    device_options.num_threads = 1;
    auto base = CreateDevice(device_options);
    ASSERT_TRUE(base.ok()) << base.status();
    device_ = std::make_shared<testutil::FaultInjectingDevice>(std::move(*base));
    EngineOptions engine_options;
    engine_options.injected_device = device_;
    auto engine = Engine::Create(engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    RankGroupOptions group_options;
    group_options.checkpoint_root = root_;
    group_options.hold_lease = HoldLease();
    group_options.settle_timeout = std::min(group_options.settle_timeout, HoldLease());
    // As rank 0 wires its checkpointer (RankProcess), once a test made one.
    group_options.replacing_state = [this](const std::string& id, uint64_t from_step,
                                           std::optional<uint64_t> kept_step)
        -> absl::StatusOr<RankGroupOptions::ReplacementDone> {
      if (checkpointer_ == nullptr) return RankGroupOptions::ReplacementDone();
      return checkpointer_->Replacing(id, from_step, kept_step);
    };
    group_ = std::make_unique<RankGroup>(group_options, engine_.get());
    ServerOptions server_options;
    server_options.host = "127.0.0.1";
    auto server = Server::Start(server_options, engine_.get(), group_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    const std::string address = "127.0.0.1:" + std::to_string(server_->port());
    ASSERT_TRUE(group_->Join(address, nullptr).ok());
    server_->SetReady(true);
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    checkpoints_ = v1::CheckpointService::NewStub(channel);
    optimizer_ = v1::OptimizerService::NewStub(channel);

    // A session with w [64, 64] and b [64], AdamW, one trainer.
    v1::CreateSessionRequest request;
    *request.mutable_spec() = testutil::MakeAdamWSpec({{"w", {64, 64}}, {"b", {64}}}, 1);
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    grpc::Status created =
        v1::OptimizerService::NewStub(channel)->CreateSession(&context, request, &response);
    ASSERT_TRUE(created.ok()) << created.error_message();
    session_ = response.summary().session_id();
  }

  // RankGroupOptions::hold_lease, and the most settle_timeout may be (a settled hold's lease runs
  // from the settle's deadline).
  virtual absl::Duration HoldLease() const { return absl::Seconds(30); }

  grpc::Status CloseSession() {
    v1::CloseSessionRequest request;
    request.set_session_id(session_);
    v1::CloseSessionResponse response;
    grpc::ClientContext context;
    return optimizer_->CloseSession(&context, request, &response);
  }

  // Step `step` of the session in process, its one trainer's gradients all ones.
  void StepSession(uint64_t step) {
    absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(session_);
    ASSERT_TRUE(session.ok()) << session.status();
    const StepHandle c = testutil::BeginStep(**session, step, 0);
    ASSERT_TRUE(testutil::SendGradient(**session, c, 0, 0, std::vector<float>(64 * 64, 1)).ok());
    ASSERT_TRUE(testutil::SendGradient(**session, c, 1, 0, std::vector<float>(64, 1)).ok());
    testutil::Outcome outcome;
    ASSERT_TRUE((*session)->Commit(c, 64 * 64 + 64, outcome.Callback()).ok());
    ASSERT_TRUE(outcome.Wait().ok());
  }

  // Steps 1 and 2: step 1 saved as "one", step 2 by a look of `checkpointer`.
  void StepTwiceSavingBoth(AutoCheckpointer& checkpointer) {
    ASSERT_NO_FATAL_FAILURE(StepSession(1));
    ASSERT_TRUE(Save("one").ok());
    ASSERT_NO_FATAL_FAILURE(StepSession(2));
    checkpointer.LookOnce();
  }

  // StepTwiceSavingBoth, then "one" loaded back; answers the session's automatic checkpoints'
  // directory, which held "step-2" before the load.
  std::filesystem::path LoadBackPastAnAutomaticSave(AutoCheckpointer& checkpointer) {
    const std::filesystem::path dir = std::filesystem::path(root_) / "auto" / session_;
    StepTwiceSavingBoth(checkpointer);
    EXPECT_TRUE(std::filesystem::exists(dir / "step-2"));
    EXPECT_TRUE(Load("one").ok());
    return dir;
  }

  grpc::Status Load(const std::string& name) {
    v1::LoadRequest request;
    request.set_session_id(session_);
    request.set_name(name);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = checkpoints_->Load(&context, request);
    v1::CheckpointProgress progress;
    while (reader->Read(&progress)) {
    }
    return reader->Finish();
  }

  // The automatic checkpointer of the group, saving each step, never started: tests look.
  AutoCheckpointer* AutoCheckpoints() {
    AutoCheckpointOptions options;
    options.checkpoint_root = root_;
    options.every_steps = 1;
    checkpointer_ = std::make_unique<AutoCheckpointer>(options, engine_.get(), group_.get());
    return checkpointer_.get();
  }

  grpc::Status Save(const std::string& name, absl::Duration timeout = absl::Seconds(60)) {
    v1::SaveRequest request;
    request.set_session_id(session_);
    request.set_name(name);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    auto reader = checkpoints_->Save(&context, request);
    v1::CheckpointProgress progress;
    while (reader->Read(&progress)) {
    }
    return reader->Finish();
  }

  // The session saved twice, as "step-1" and "step-2" of its automatic checkpoints (moved under
  // <root>/auto/<id>/, with the session's record) and closed, then restored as a restart does, the
  // first copy of a tensor onto the device in the load failing with `fault`. Answers the sessions
  // restored; `dir` is set to the automatic checkpoints' directory.
  std::vector<RestoredSession> RestoreWithTheFirstLoadFailing(absl::Status fault,
                                                              std::filesystem::path& dir) {
    dir = SaveTwiceAsAutomaticCheckpoints();
    if (dir.empty()) return {};
    testutil::FaultInjectingDevice& device = *device_;
    AutoRestoreOptions options = RestoreOptions();
    options.before_load = [&](const std::string&) {
      device.faults().FailCall("CopyFromHost", device.faults().calls("CopyFromHost") + 1, fault);
    };
    absl::StatusOr<std::vector<RestoredSession>> restored =
        RestoreAutoCheckpoints(options, group_.get());
    EXPECT_TRUE(restored.ok()) << restored.status();  // one rank: none can be lost
    return restored.ok() ? *std::move(restored) : std::vector<RestoredSession>();
  }

  // A restore of the root, tried again at once.
  AutoRestoreOptions RestoreOptions() const {
    AutoRestoreOptions options;
    options.checkpoint_root = root_;
    options.first_retry = absl::Milliseconds(1);
    return options;
  }

  // The session saved twice, as "step-1" and "step-2" of its automatic checkpoints (moved under
  // <root>/auto/<id>/, with the session's record) and closed; answers their directory.
  std::filesystem::path SaveTwiceAsAutomaticCheckpoints() {
    namespace fs = std::filesystem;
    if (!Save("a").ok() || !Save("b").ok() || !CloseSession().ok()) return {};
    const fs::path dir = fs::path(root_) / "auto" / session_;
    fs::create_directories(dir);
    fs::rename(fs::path(root_) / "a", dir / "step-1");
    fs::rename(fs::path(root_) / "b", dir / "step-2");
    std::ofstream(dir / "session.json")
        << "{\"session_id\": \"" << session_ << "\", \"name\": \"\", \"owner\": \"\"}\n";
    return dir;
  }

  // The session saved twice as its automatic checkpoints (SaveTwiceAsAutomaticCheckpoints), then
  // restored with `file` of their directory unreadable (BreakReads; "." for that directory, ".."
  // for the directory of every session's) until the `put_back_at`-th retry (0: for good). Expects
  // the retries, and when `file` stays unreadable, the restore to end UNAVAILABLE naming it. Either
  // way the checkpoints are as they were. Answers the sessions restored.
  std::vector<RestoredSession> RestoreWithReadsBroken(const std::string& file, int put_back_at) {
    const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
    EXPECT_FALSE(dir.empty());
    const std::filesystem::path broken = file == ".."  ? dir.parent_path()
                                         : file == "." ? dir
                                                       : std::filesystem::path(dir / file);
    std::function<void()> put_back = BreakReads(broken);
    int retries = 0;
    AutoRestoreOptions options = RestoreOptions();
    options.before_retry = [&](const absl::Status& failed) {
      EXPECT_THAT(failed.message(), HasSubstr(broken.string()));
      if (++retries == put_back_at) put_back();
    };
    absl::StatusOr<std::vector<RestoredSession>> restored =
        RestoreAutoCheckpoints(options, group_.get());
    if (put_back_at == 0) {
      EXPECT_EQ(retries, options.attempts - 1);
      EXPECT_THAT(restored, testutil::StatusIs(absl::StatusCode::kUnavailable, broken.string()));
      put_back();
    } else {
      EXPECT_EQ(retries, put_back_at);
      EXPECT_TRUE(restored.ok()) << restored.status();
    }
    EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-1", "step-2"));
    return restored.ok() ? *std::move(restored) : std::vector<RestoredSession>();
  }

  // Makes `path` fail every open and stat with ELOOP (a link to itself), for a read that fails
  // for a passing reason as EIO does, even for root; answers a function that puts it back.
  static std::function<void()> BreakReads(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    const fs::path kept = fs::path(path.string() + ".kept");
    fs::rename(path, kept);
    fs::create_symlink(path.filename(), path);
    return [path, kept] {
      std::error_code error;
      fs::remove(path, error);
      fs::rename(kept, path, error);
    };
  }

  std::string root_;
  std::shared_ptr<testutil::FaultInjectingDevice> device_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<AutoCheckpointer> checkpointer_;  // made by a test (AutoCheckpoints)
  std::unique_ptr<v1::CheckpointService::Stub> checkpoints_;
  std::unique_ptr<v1::OptimizerService::Stub> optimizer_;
  std::string session_;
};

TEST_F(CheckpointSaveTest, AFailedSaveLeavesNothingInTheRoot) {
  // The third copy of a tensor to the host fails: some of the shard is written by then.
  device_->faults().FailCall("CopyToHost", device_->faults().calls("CopyToHost") + 3,
                             absl::InternalError("injected: device lost"));
  grpc::Status failed = Save("s1");
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(failed.error_message(), HasSubstr("injected: device lost"));
  EXPECT_THAT(DirectoryEntries(root_), IsEmpty());
  // The same name saves once the device works again.
  device_->faults().Clear();
  grpc::Status saved = Save("s1");
  EXPECT_TRUE(saved.ok()) << saved.error_message();
  EXPECT_THAT(DirectoryEntries(root_), ElementsAre("s1"));
}

// A hold's lease (and a settle's deadline) far shorter than a save takes.
class ShortLeaseSaveTest : public CheckpointSaveTest {
 protected:
  absl::Duration HoldLease() const override { return absl::Milliseconds(200); }
};

// Rank 0 renews the hold on every rank while the operation runs (every third of the lease), so
// that a save slower than the lease still commits: it checks the hold is still its own first.
TEST_F(ShortLeaseSaveTest, ASaveLongerThanTheHoldsLeaseCommits) {
  const int64_t next = device_->faults().calls("CopyToHost") + 1;
  device_->faults().DelayCalls("CopyToHost", next, next + 1, absl::Milliseconds(600));
  const grpc::Status saved = Save("slow");
  EXPECT_TRUE(saved.ok()) << saved.error_message();
  EXPECT_GE(device_->faults().calls("CopyToHost"), next + 1) << "the save copied no tensor";
  EXPECT_THAT(DirectoryEntries(root_), ElementsAre("slow"));
}

// A call that waits its turn behind its caller's 16 running calls and is cancelled meanwhile does
// nothing when its turn comes. Before, a CloseSession its caller had given up on (and was told
// was cancelled) closed the session later, and a cancelled Save was written.
TEST_F(CheckpointSaveTest, ACallCancelledWhileItWaitedItsTurnDoesNothing) {
  const int64_t next = device_->faults().calls("CopyToHost") + 1;
  device_->faults().DelayCalls("CopyToHost", next, next + 1000, absl::Milliseconds(50));
  constexpr int kRunning = 16;  // CallerCalls::Limits::per_caller
  std::vector<grpc::Status> saved(kRunning);
  std::vector<std::thread> saves;
  for (int i = 0; i < kRunning; ++i) {
    saves.emplace_back([&, i] { saved[i] = Save(absl::StrCat("s", i)); });
  }
  // The saves run (one by one on the session's hold, each for longer than this takes).
  for (const absl::Time end = absl::Now() + absl::Seconds(10);
       ProcessCallerCalls().running() < kRunning && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(ProcessCallerCalls().running(), kRunning);
  v1::CloseSessionRequest request;
  request.set_session_id(session_);
  v1::CloseSessionResponse response;
  grpc::ClientContext context;
  // Well before the first save ends (it copies for 300 ms).
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(50)));
  const grpc::Status closed = optimizer_->CloseSession(&context, request, &response);
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << closed.error_message();
  const grpc::Status late = Save("late", absl::Milliseconds(50));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << late.error_message();
  for (std::thread& save : saves) save.join();  // the close had its turn meanwhile
  for (const grpc::Status& status : saved) EXPECT_TRUE(status.ok()) << status.error_message();
  const grpc::Status after = Save("after");
  EXPECT_TRUE(after.ok()) << "the session is gone: " << after.error_message();
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "late"))
      << "the cancelled save was made";
}

// A session loaded back to step 1 that stepped past its last automatic save (step 2) before the
// checkpointer looked: the abandoned timeline's step 2 goes, from the step the load set. Before,
// nothing was abandoned (the step was not behind the save), or only from the step the session
// had reached, and a restart restored the abandoned step 2.
TEST_F(CheckpointSaveTest, ALoadBackThatSteppedPastTheLastAutomaticSaveAbandonsIt) {
  namespace fs = std::filesystem;
  AutoCheckpointer* checkpointer = AutoCheckpoints();
  fs::path dir;
  ASSERT_NO_FATAL_FAILURE(dir = LoadBackPastAnAutomaticSave(*checkpointer));
  ASSERT_NO_FATAL_FAILURE(StepSession(2));
  ASSERT_NO_FATAL_FAILURE(StepSession(3));
  checkpointer->LookOnce();
  EXPECT_FALSE(fs::exists(dir / "step-2")) << "the abandoned timeline's checkpoint stayed";
  EXPECT_TRUE(fs::exists(dir / "step-3"));
}

// A Load back to step 1 removes the automatic checkpoints of the timeline it leaves (step 2)
// before any rank applies it, not at the checkpointer's next look: a restart in between restored
// step 2 over the loaded state, and its trainer, told that its step was applied, went on from the
// abandoned run.
TEST_F(CheckpointSaveTest, ALoadRemovesTheCheckpointsOfTheTimelineItLeavesAtOnce) {
  std::filesystem::path dir;
  ASSERT_NO_FATAL_FAILURE(dir = LoadBackPastAnAutomaticSave(*AutoCheckpoints()));
  // No look since: a restart now finds nothing of the timeline left (it removes what is set
  // aside), and the next look removes it.
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre(".step-2.abandoned", "session.json"));
  checkpointer_->LookOnce();
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-1"));
}

// A Load of the session's own automatic checkpoint keeps it: it holds the new timeline's state
// of its step. Before, the Load set it aside with the newer ones and the next look removed it,
// so that until a save of the new timeline committed a restart found no checkpoint of the
// session, or an older one.
TEST_F(CheckpointSaveTest, ALoadOfTheSessionsOwnAutomaticCheckpointKeepsIt) {
  AutoCheckpointer& checkpointer = *AutoCheckpoints();
  const std::filesystem::path dir = std::filesystem::path(root_) / "auto" / session_;
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(StepSession(step));
    checkpointer.LookOnce();
  }
  ASSERT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-2", "step-3"));
  ASSERT_TRUE(Load(absl::StrCat("auto/", session_, "/step-2")).ok());
  EXPECT_THAT(DirectoryEntries(dir.string()),
              ElementsAre(".step-3.abandoned", "session.json", "step-2"));
  checkpointer.LookOnce();  // removes what the Load set aside; nothing is due
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-2"));
  ASSERT_NO_FATAL_FAILURE(StepSession(3));
  checkpointer.LookOnce();  // the new timeline's step 3
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-2", "step-3"));
}

// A replacement that was not applied (its holds lost before any rank applied) brings back what it
// set aside: the session goes on in its timeline, and a restart still finds its checkpoints.
TEST_F(CheckpointSaveTest, AReplacementNotAppliedBringsBackWhatItSetAside) {
  AutoCheckpointer* checkpointer = AutoCheckpoints();
  ASSERT_NO_FATAL_FAILURE(StepTwiceSavingBoth(*checkpointer));
  const std::filesystem::path dir = std::filesystem::path(root_) / "auto" / session_;
  absl::StatusOr<RankGroupOptions::ReplacementDone> done = checkpointer->Replacing(session_, 1);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre(".step-2.abandoned", "session.json"));
  (*done)(/*applied=*/false);
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-2"));
  checkpointer->LookOnce();
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-2"));
}

// An automatic save that finds the state replaced after the checkpointer's last look (a Load
// took the hold first) saves nothing: the next look abandons the old timeline, then saves the
// new one. Before, it saved the loaded state, and the next look took that save for the old
// timeline's and removed it.
TEST_F(CheckpointSaveTest, AnAutomaticSaveOfAStateReplacedSinceTheLastLookIsDeferred) {
  namespace fs = std::filesystem;
  AutoCheckpointer* checkpointer = AutoCheckpoints();
  ASSERT_NO_FATAL_FAILURE(StepTwiceSavingBoth(*checkpointer));
  ASSERT_TRUE(Load("one").ok());
  absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(session_);
  ASSERT_TRUE(session.ok());
  bool replaced = false;
  const absl::StatusOr<uint64_t> saved = checkpointer->SaveNow(**session, &replaced);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kAborted) << saved.status();
  EXPECT_TRUE(replaced);
  const fs::path dir = fs::path(root_) / "auto" / session_;
  EXPECT_FALSE(fs::exists(dir / "step-1"));
  checkpointer->LookOnce();
  EXPECT_TRUE(fs::exists(dir / "step-1"));
  EXPECT_FALSE(fs::exists(dir / "step-2"));
}

// The checkpointer forgets a session once it is closed: before, the id of every closed session
// stayed in rank 0 for ever, and a tenant that created and closed sessions grew it without bound.
TEST_F(CheckpointSaveTest, TheCheckpointerForgetsAClosedSession) {
  AutoCheckpointer* checkpointer = AutoCheckpoints();
  ASSERT_NO_FATAL_FAILURE(StepSession(1));
  checkpointer->LookOnce();
  EXPECT_EQ(checkpointer->RememberedSessions(), 1u);
  ASSERT_TRUE(CloseSession().ok());
  checkpointer->SessionClosed(session_);  // as rank 0's RankGroup tells it
  checkpointer->LookOnce();
  EXPECT_EQ(checkpointer->RememberedSessions(), 0u);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(root_) / "auto" / session_));
}

// An export refused for want of a slot (two of the session's are open, unread) is refused
// before its copy of the state is made: here every later copy to the host fails, and the refusal
// is RESOURCE_EXHAUSTED all the same. Before, the copy came first (the session held while every
// rank copied its state: a caller retrying such exports copied the state each time), and only
// then the refusal.
TEST_F(CheckpointSaveTest, AnExportRefusedForWantOfASlotMakesNoCopy) {
  v1::CreateSessionRequest create;
  *create.mutable_spec() = testutil::MakeAdamWSpec({{"wide", {1 << 20}}}, 1);
  create.mutable_spec()->set_name("wide");
  v1::CreateSessionResponse created;
  grpc::ClientContext create_context;
  ASSERT_TRUE(optimizer_->CreateSession(&create_context, create, &created).ok());
  v1::ExportStateDictRequest request;
  request.set_session_id(created.summary().session_id());
  auto stub = v1::CheckpointService::NewStub(
      testutil::SlowReaderChannel("127.0.0.1:" + std::to_string(server_->port())));
  testutil::UnreadExport first(*stub, request), second(*stub, request);
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(second.started());
  testutil::FaultInjector& faults = device_->faults();
  faults.FailCalls("CopyToHost", faults.calls("CopyToHost") + 1, INT64_MAX,
                   absl::InternalError("injected: no copy may be made"));
  grpc::ClientContext context;
  auto third = stub->ExportStateDict(&context, request);
  v1::StateDictChunk chunk;
  while (third->Read(&chunk)) {
  }
  const grpc::Status refused = third->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("exports of session"));
  (void)first.Cancel();
  (void)second.Cancel();
}

TEST_F(CheckpointSaveTest, UnsafeNamesAreRefusedEscaped) {
  grpc::Status refused = Save("a\nb");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("checkpoint name 'a\\nb' contains the control character '\\n'"));
  for (const std::string& name :
       {std::string("\x1b[2Jx"), std::string("del\x7f"), std::string(""), std::string(".."),
        std::string(".hidden"), std::string("a/b"), std::string(300, 'n')}) {
    EXPECT_EQ(Save(name).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
  }
  EXPECT_THAT(DirectoryEntries(root_), IsEmpty());
}

// A load that fails for a passing reason (a busy disk or peer) is tried again: neither given up
// for the older checkpoint nor set aside.
TEST_F(CheckpointSaveTest, ARestoreTriesALoadThatFailedForAPassingReasonAgain) {
  std::filesystem::path dir;
  const std::vector<RestoredSession> restored =
      RestoreWithTheFirstLoadFailing(absl::UnavailableError("injected: the disk is busy"), dir);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-1", "step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreFallsBackFromACheckpointThatIsDamaged) {
  std::filesystem::path dir;
  const std::vector<RestoredSession> restored =
      RestoreWithTheFirstLoadFailing(absl::DataLossError("injected: the shard is damaged"), dir);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-1"));
  EXPECT_THAT(DirectoryEntries(dir.string()),
              ElementsAre(".step-2.unusable", "session.json", "step-1"));
}

// A read that fails for a passing reason (EIO, an NFS pause) is tried again. Before, the session
// was left out at once when its record did not read, and restored from the older checkpoint when
// the newest manifest did not (its listing left the newest out, which was then removed).
TEST_F(CheckpointSaveTest, ARestoreTriesASessionRecordThatDidNotReadAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken("session.json", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreTriesAManifestThatDidNotReadAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken("step-2/manifest.json", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

// The manifests of older checkpoints are read only when the newer did not load: one that does not
// read is no reason to end the restore (before this release's listing, it was left out; with a
// listing that read every manifest, it ended every restore).
TEST_F(CheckpointSaveTest, ARestoreReadsNoManifestOlderThanTheCheckpointItLoads) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  std::function<void()> put_back = BreakReads(dir / "step-1" / "manifest.json");
  int retries = 0;
  AutoRestoreOptions options = RestoreOptions();
  options.before_retry = [&](const absl::Status&) { ++retries; };
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(options, group_.get());
  put_back();
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_EQ(retries, 0);
}

// The session's creation on every rank is tried again too when it fails for a passing reason
// (here the device's first allocation); before, the session was left out.
TEST_F(CheckpointSaveTest, ARestoreTriesASessionsCreationThatFailedForAPassingReasonAgain) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  device_->faults().FailCall("Allocate", device_->faults().calls("Allocate") + 1,
                             absl::UnavailableError("injected: the device is busy"));
  int retries = 0;
  AutoRestoreOptions options = RestoreOptions();
  options.before_retry = [&](const absl::Status& failed) {
    EXPECT_THAT(failed.message(), HasSubstr("injected: the device is busy"));
    ++retries;
  };
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(options, group_.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_EQ(retries, 1);
}

// One that fails every time ends the restore (rank 0 exits for a restart) rather than leave the
// session out, or restore it from an older checkpoint and remove the newer: nothing is set aside.
// Before, a load that failed so fell back to the older checkpoint.
TEST_F(CheckpointSaveTest, ARestoreThatCannotReadTheSessionRecordEndsForARestart) {
  RestoreWithReadsBroken("session.json", 0);
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotReadTheNewestManifestEndsForARestart) {
  RestoreWithReadsBroken("step-2/manifest.json", 0);
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotLoadTheNewestCheckpointEndsForARestart) {
  RestoreWithReadsBroken("step-2/shard-0-of-1.safetensors", 0);
}

// A session's directory that cannot be looked at (stat fails) fails the listing, which is tried
// again. Before, it was passed over, the listing answered without it, and the group served
// without the session (no error, no restart).
TEST_F(CheckpointSaveTest, ARestoreTriesASessionsDirectoryThatCouldNotBeLookedAtAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken(".", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotLookAtASessionsDirectoryEndsForARestart) {
  RestoreWithReadsBroken(".", 0);
}

// Entries that are nothing of the sessions' (a file; a hidden name, but a closed session's) are
// passed over, whether they can be looked at or not: they are no reason to end every restore.
TEST_F(CheckpointSaveTest, ARestorePassesOverEntriesThatAreNoSessions) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir.parent_path() / "README") << "automatic checkpoints\n";
  std::filesystem::create_symlink(".junk", dir.parent_path() / ".junk");  // to itself
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(RestoreOptions(), group_.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotListTheAutomaticCheckpointsEndsForARestart) {
  RestoreWithReadsBroken("..", 0);
}

}  // namespace
}  // namespace optstep
