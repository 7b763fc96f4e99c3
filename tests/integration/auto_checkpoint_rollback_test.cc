// Automatic checkpoints of a session whose state was replaced (real server processes on
// loopback): a Load of an earlier checkpoint, or an import at the session's own step, starts a new
// timeline. The automatic checkpoints of the old one from that step on are abandoned, and the
// state loaded is saved at once, so that a restart never restores the state the user left.

#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "tests/integration/auto_checkpoint_run.h"
#include "tests/integration/test_session.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

namespace fs = std::filesystem;
using ::optstep::testutil::AutoFlags;
using ::optstep::testutil::AwaitAutoCheckpoint;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Running;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StartRunning;
using ::optstep::testutil::StepRange;
using ::optstep::testutil::TempDir;

// A session taken back to an earlier state (a user's Load of an earlier checkpoint) starts a new
// timeline: the automatic checkpoints of its later steps are removed and the loaded state is
// saved at once. Before, nothing was saved until the session passed its old highest step, and a
// restart restored the later state the user had abandoned, over everything stepped since.
TEST(AutoCheckpointRollbackTest, ALoadOfAnEarlierStateAbandonsTheLaterAutomaticCheckpoints) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, AutoFlags(root.path())));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("r")));
  const std::string session = info.session_id();
  for (uint64_t step = 1; step <= 4; ++step) {
    ASSERT_THAT(StepRange(*run.client, session, step, step), IsOk());
    ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, step), IsOk());
    if (step == 2) {
      ASSERT_THAT(run.client->Save(session, "good").status(), IsOk());
    }
  }
  const fs::path dir = fs::path(root.path()) / "auto" / session;
  const fs::path step_2 = dir / "step-2" / "manifest.json";
  // When step 2's manifest was written; the least time while there is none (it is being saved).
  const auto written = [&step_2] {
    std::error_code error;
    const auto time = fs::last_write_time(step_2, error);
    return error ? fs::file_time_type::min() : time;
  };
  const auto first = written();
  ASSERT_THAT(run.client->Load(session, "good").status(), IsOk());
  // The later timeline goes; step 2 is saved again, from the state loaded.
  const auto done = [&] {
    const auto now = written();
    return !fs::exists(dir / "step-3") && !fs::exists(dir / "step-4") &&
           now != fs::file_time_type::min() && now != first;
  };
  for (const absl::Time deadline = absl::Now() + absl::Seconds(20);
       !done() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(fs::exists(dir / "step-3"));
  EXPECT_FALSE(fs::exists(dir / "step-4"));
  EXPECT_TRUE(done()) << "step 2 was not saved again";
  ASSERT_THAT(StepRange(*run.client, session, 3, 3), IsOk());
  EXPECT_THAT(AwaitAutoCheckpoint(root.path(), session, 3), IsOk());
}

// A state imported at the session's own step (another state, the same counters) is a new
// timeline as well: the automatic checkpoint of that step, of the state replaced, is saved again
// from the state imported. Before, only a step behind the last save told the checkpointer, and a
// restart restored the state the import had replaced.
TEST(AutoCheckpointRollbackTest, AnImportAtTheSameStepIsSavedAgain) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, AutoFlags(root.path())));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("i")));
  const std::string session = info.session_id();
  ASSERT_THAT(StepRange(*run.client, session, 1, 2), IsOk());
  ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 2), IsOk());
  const fs::path manifest = fs::path(root.path()) / "auto" / session / "step-2" / "manifest.json";
  const auto written = [&manifest] {
    std::error_code error;
    const auto time = fs::last_write_time(manifest, error);
    return error ? fs::file_time_type::min() : time;
  };
  const auto first = written();
  v1::ExportStateDictRequest request;
  request.set_session_id(session);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<Client::StateDictEntry> entries,
                               run.client->ExportStateDict(request));
  bool changed = false;
  for (Client::StateDictEntry& entry : entries) {
    if (entry.key.rfind("param/", 0) != 0 || entry.bytes.empty()) continue;
    entry.bytes[0] ^= 0x40;  // another value of the first element
    changed = true;
  }
  ASSERT_TRUE(changed);
  ASSERT_THAT(run.client->ImportStateDict(session, entries), IsOk());
  const auto saved_again = [&] {
    const auto now = written();
    return now != fs::file_time_type::min() && now != first;
  };
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       !saved_again() && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(saved_again()) << "step 2 keeps the state the import replaced";
}

// Taken back to step 0 (a checkpoint saved before the first step): its automatic checkpoints go
// as well, though nothing is due until the next step. Before, they stayed.
TEST(AutoCheckpointRollbackTest, ALoadOfTheStateBeforeTheFirstStepAbandonsThemToo) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, StartRunning(1, AutoFlags(root.path())));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, run.client->CreateSession(SmallSpec("z")));
  const std::string session = info.session_id();
  ASSERT_THAT(run.client->Save(session, "zero").status(), IsOk());
  ASSERT_THAT(StepRange(*run.client, session, 1, 3), IsOk());
  ASSERT_THAT(AwaitAutoCheckpoint(root.path(), session, 3), IsOk());
  ASSERT_THAT(run.client->Load(session, "zero").status(), IsOk());
  const fs::path dir = fs::path(root.path()) / "auto" / session;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(20);
       fs::exists(dir / "step-3") && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(fs::exists(dir / "step-2"));
  EXPECT_FALSE(fs::exists(dir / "step-3"));
  ASSERT_THAT(StepRange(*run.client, session, 1, 1), IsOk());
  EXPECT_THAT(AwaitAutoCheckpoint(root.path(), session, 1), IsOk());
}

}  // namespace
}  // namespace optstep
