// Save through the real services, engine and a fault-injecting CPU device in process: a save that
// fails halfway (the device fails a copy of a tensor to the host) leaves nothing in the checkpoint
// root, the next save of the same name succeeds, and names that are unsafe are refused naming
// the name escaped, before any file is touched; loads and the automatic checkpointer meet them.
// The automatic restore from such checkpoints: auto_restore_test.cc.

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/rpc/checkpoint_save_fixture.h"

namespace optstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testutil::DirectoryEntries;

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

// A close told while an automatic save of the session runs (here slowed in its copy) removes its
// checkpoints at once, before any rank drops the session. Before, it left them to the save's
// end: a rank 0 lost meanwhile, once the ranks had dropped the session, left them for a restart
// to bring the closed session back.
TEST_F(CheckpointSaveTest, AClosedSessionsCheckpointsGoAtOnceWhileASaveOfItRuns) {
  namespace fs = std::filesystem;
  AutoCheckpointer* checkpointer = AutoCheckpoints();
  ASSERT_NO_FATAL_FAILURE(StepSession(1));
  checkpointer->LookOnce();
  const fs::path dir = fs::path(root_) / "auto" / session_;
  ASSERT_TRUE(fs::exists(dir / "step-1"));
  ASSERT_NO_FATAL_FAILURE(StepSession(2));
  absl::StatusOr<std::shared_ptr<Session>> session = engine_->GetSession(session_);
  ASSERT_TRUE(session.ok()) << session.status();
  testutil::FaultInjector& faults = device_->faults();
  const int64_t copies = faults.calls("CopyToHost");
  faults.DelayCalls("CopyToHost", copies + 1, copies + 1, absl::Seconds(2));
  std::thread save([&] { (void)checkpointer->SaveNow(**session); });
  while (faults.calls("CopyToHost") == copies) absl::SleepFor(absl::Milliseconds(5));
  checkpointer->SessionClosed(session_);  // as rank 0's RankGroup tells it, the save in its copy
  EXPECT_FALSE(fs::exists(dir)) << "the closed session's checkpoints wait for the save's end";
  save.join();
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_THAT(DirectoryEntries((fs::path(root_) / "auto").string()), IsEmpty());
}

// An export refused for want of a slot (two of the session's are open, unread) is refused
// before its copy of the state is made: here every later copy to the host fails, and the refusal
// is RESOURCE_EXHAUSTED all the same. Before, the copy came first (the session held while every
// rank copied its state: a caller retrying such exports copied the state each time), and only
// then the refusal.
TEST_F(CheckpointSaveTest, AnExportRefusedForWantOfASlotMakesNoCopy) {
  std::unique_ptr<ExportSlotsTaken> taken = TakeExportSlots();
  const v1::ExportStateDictRequest& request = taken->request;
  auto& stub = taken->stub;
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
  (void)taken->first->Cancel();
  (void)taken->second->Cancel();
}

// A malformed export is named as such before the limits are looked at: with both slots taken, an
// unknown layout, chunk prefix or model chunk is answered for what it is, not RESOURCE_EXHAUSTED
// (before, after a slot, a place and a copy of every rank's state, had they been free).
TEST_F(CheckpointSaveTest, AMalformedExportIsNamedBeforeTheLimits) {
  std::unique_ptr<ExportSlotsTaken> taken = TakeExportSlots();
  auto& stub = taken->stub;
  v1::ExportStateDictRequest layout = taken->request, prefix = taken->request,
                             chunk = taken->request;
  layout.set_layout(static_cast<v1::StateDictLayout>(7));
  prefix.set_chunk_prefix("x");
  chunk.add_model_chunks(3);
  const std::pair<const v1::ExportStateDictRequest*, grpc::StatusCode> cases[] = {
      {&layout, grpc::StatusCode::INVALID_ARGUMENT},
      {&prefix, grpc::StatusCode::INVALID_ARGUMENT},
      {&chunk, grpc::StatusCode::NOT_FOUND}};
  for (const auto& [malformed, code] : cases) {
    grpc::ClientContext context;
    auto reader = stub->ExportStateDict(&context, *malformed);
    v1::StateDictChunk read;
    while (reader->Read(&read)) {
    }
    const grpc::Status refused = reader->Finish();
    EXPECT_EQ(refused.error_code(), code) << refused.error_message();
    EXPECT_THAT(refused.error_message(), HasSubstr("ExportStateDict: "));
  }
  (void)taken->first->Cancel();
  (void)taken->second->Cancel();
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

}  // namespace
}  // namespace optstep
