// Session ids and names as the engine hands them out: ids are 128 random bits (never the
// sequence s000001, s000002, ... that restarted at 1 with every process), and a name is scoped
// to its owner: two owners may each have "run1", and attaching by name finds only the caller's.
// A creation retried with its request id (a client's retry after a lost answer) answers the
// session it made, never a second one.

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;
using ::testing::MatchesRegex;

TEST(EngineIdentityTest, SessionIdsAre128RandomBitsInHex) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = Engine::NextSessionId();
    EXPECT_THAT(id, MatchesRegex("s[0-9a-f]{32}"));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u) << "an id was handed out twice";
}

TEST(EngineIdentityTest, TwoEnginesDoNotStartTheSameSequence) {
  auto first = testutil::MakeEngine();
  auto second = testutil::MakeEngine();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  auto a = testutil::MakeSession(*first, config);
  auto b = testutil::MakeSession(*second, config);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->id(), b->id()) << "a restarted rank handed out an id of the previous process";
}

TEST(EngineIdentityTest, NamesAreScopedPerOwner) {
  auto engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig alice = testutil::TwoParamConfig(testutil::Sgd(0.1));
  alice.name = "run1";
  alice.owner = "alice";
  SessionConfig bob = alice;
  bob.owner = "bob";

  auto created_alice = engine->CreateSession(alice);
  ASSERT_TRUE(created_alice.ok()) << created_alice.status();
  EXPECT_FALSE(created_alice->attached);
  // Bob's "run1" is a session of his own, not an attachment to Alice's.
  auto created_bob = engine->CreateSession(bob);
  ASSERT_TRUE(created_bob.ok()) << created_bob.status();
  EXPECT_FALSE(created_bob->attached);
  EXPECT_NE(created_bob->session->id(), created_alice->session->id());
  // Each owner attaches to their own.
  auto again = engine->CreateSession(alice);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->attached);
  EXPECT_EQ(again->session->id(), created_alice->session->id());
  // A different definition under Bob's name does not tell Bob about Alice's session.
  SessionConfig carol = alice;
  carol.owner = "carol";
  carol.definition_key = "another definition";
  auto created_carol = engine->CreateSession(carol);
  ASSERT_TRUE(created_carol.ok()) << created_carol.status();
  EXPECT_FALSE(created_carol->attached);
  alice.definition_key = "another definition";
  EXPECT_THAT(engine->CreateSession(alice).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(EngineIdentityTest, ARetriedCreationAnswersTheSessionItMade) {
  auto engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig alice = testutil::TwoParamConfig(testutil::Sgd(0.1));
  alice.owner = "alice";
  alice.request_id = "r1";  // unnamed: only the request id tells the retry from a new session

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created first, engine->CreateSession(alice));
  EXPECT_FALSE(first.attached);
  EXPECT_TRUE(first.made);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created retried, engine->CreateSession(alice));
  EXPECT_EQ(retried.session->id(), first.session->id());
  EXPECT_FALSE(retried.attached) << "a retry answers as the call that created the session";
  // ... but did not make it: an answer too large for the retry must not close it.
  EXPECT_FALSE(retried.made);
  EXPECT_EQ(engine->ListSessions().size(), 1u);

  // Another request id is another session; Bob's "r1" is not Alice's.
  SessionConfig again = alice;
  again.request_id = "r2";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created second, engine->CreateSession(again));
  EXPECT_NE(second.session->id(), first.session->id());
  SessionConfig bob = alice;
  bob.owner = "bob";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created bobs, engine->CreateSession(bob));
  EXPECT_NE(bobs.session->id(), first.session->id());
  EXPECT_FALSE(bobs.attached);
  EXPECT_EQ(engine->ListSessions().size(), 3u);

  // The request id comes before the name: a retry of a named creation is not an attachment.
  SessionConfig named = alice;
  named.name = "run";
  named.request_id = "r3";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created made, engine->CreateSession(named));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created remade, engine->CreateSession(named));
  EXPECT_EQ(remade.session->id(), made.session->id());
  EXPECT_FALSE(remade.attached);
  named.request_id = "r4";  // another trainer of the job
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created joined, engine->CreateSession(named));
  EXPECT_EQ(joined.session->id(), made.session->id());
  EXPECT_TRUE(joined.attached);
  EXPECT_FALSE(joined.made);

  // A request id reused for another definition is refused, naming it and the session.
  alice.definition_key = "another definition";
  EXPECT_THAT(engine->CreateSession(alice).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("request_id 'r1' created session ", first.session->id())));
  EXPECT_EQ(engine->ListSessions().size(), 4u);
}

// A call and its retry racing (the retry sent while the first attempt still builds the session):
// one session, both answered with it, and only one of them made it.
TEST(EngineIdentityTest, ACreationAndItsRetryAtOnceMakeOneSession) {
  auto engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.owner = "alice";
  config.request_id = "raced";
  constexpr int kCalls = 4;
  std::vector<absl::StatusOr<Engine::Created>> answers(kCalls, absl::UnknownError("not run"));
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] { answers[i] = engine->CreateSession(config); });
  }
  for (std::thread& call : calls) call.join();
  int made = 0;
  for (const auto& answer : answers) {
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->session->id(), answers[0]->session->id());
    EXPECT_FALSE(answer->attached);
    made += answer->made ? 1 : 0;
  }
  EXPECT_EQ(made, 1);
  EXPECT_EQ(engine->ListSessions().size(), 1u);
}

}  // namespace
}  // namespace optstep
