// Engine::AttachSharedMemory against CloseSession: an attach that found its session before the
// session closed, and made its segment after the close dropped the session's segments, gives the
// segment back at once and answers NOT_FOUND; its bytes would otherwise stay taken from the
// rank's budget (and its descriptor open) until the process ends.

#include <memory>
#include <utility>
#include <string>

#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(EngineSharedMemoryTest, ASegmentAttachedToASessionClosedMeanwhileIsGivenBack) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.mode = GradientMode::kReplicated;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created created, engine->CreateSession(std::move(config)));
  std::shared_ptr<Session> session = std::move(created.session);
  const int64_t admitted = engine->memory_budget().admitted();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto attached, engine->AttachSharedMemory(*session, 0));
  EXPECT_GT(engine->memory_budget().admitted(), admitted);
  attached.reset();

  // The attach's lookup of the session came before this close.
  ASSERT_THAT(engine->CloseSession(session->id()), IsOk());
  // What is left is the session's own reservation, until this last reference goes.
  EXPECT_EQ(engine->memory_budget().admitted(), admitted);
  EXPECT_THAT(engine->AttachSharedMemory(*session, 0).status(),
              StatusIs(absl::StatusCode::kNotFound, session->id()));
  EXPECT_EQ(engine->memory_budget().admitted(), admitted);
  EXPECT_EQ(engine->shared_segments().bytes(), 0);
  session.reset();
  EXPECT_EQ(engine->memory_budget().admitted(), 0);
}

}  // namespace
}  // namespace optstep
