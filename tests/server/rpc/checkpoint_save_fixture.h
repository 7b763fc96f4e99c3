#ifndef OPTSTEP_TESTS_SERVER_RPC_CHECKPOINT_SAVE_FIXTURE_H_
#define OPTSTEP_TESTS_SERVER_RPC_CHECKPOINT_SAVE_FIXTURE_H_

// The fixture of checkpoint_save_test.cc and auto_restore_test.cc: the real services, engine and
// rank group of one rank in process, on a fault-injecting CPU device, with a checkpoint root of
// its own.

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

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

  // A WideSession whose two export slots are taken by exports nobody reads, over `stub`.
  struct ExportSlotsTaken {
    v1::ExportStateDictRequest request;
    std::unique_ptr<v1::CheckpointService::Stub> stub;
    std::unique_ptr<testutil::UnreadExport> first, second;
  };
  std::unique_ptr<ExportSlotsTaken> TakeExportSlots() {
    auto taken = std::make_unique<ExportSlotsTaken>();
    taken->request.set_session_id(WideSession());
    taken->stub = v1::CheckpointService::NewStub(
        testutil::SlowReaderChannel("127.0.0.1:" + std::to_string(server_->port())));
    taken->first = std::make_unique<testutil::UnreadExport>(*taken->stub, taken->request);
    taken->second = std::make_unique<testutil::UnreadExport>(*taken->stub, taken->request);
    EXPECT_TRUE(taken->first->started());
    EXPECT_TRUE(taken->second->started());
    return taken;
  }

  // Makes a session "wide" of one parameter of 2^20 elements; answers its id.
  std::string WideSession() {
    v1::CreateSessionRequest create;
    *create.mutable_spec() = testutil::MakeAdamWSpec({{"wide", {1 << 20}}}, 1);
    create.mutable_spec()->set_name("wide");
    v1::CreateSessionResponse created;
    grpc::ClientContext context;
    EXPECT_TRUE(optimizer_->CreateSession(&context, create, &created).ok());
    return created.summary().session_id();
  }

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
      EXPECT_THAT(failed.message(), ::testing::HasSubstr(broken.string()));
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
    EXPECT_THAT(testutil::DirectoryEntries(dir.string()),
                ::testing::ElementsAre("session.json", "step-1", "step-2"));
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

}  // namespace optstep

#endif  // OPTSTEP_TESTS_SERVER_RPC_CHECKPOINT_SAVE_FIXTURE_H_
