// One owner's share of a rank (--max_sessions_per_owner, --owner_memory_share): a tenant that
// creates sessions until it is refused takes neither every session nor the whole memory budget,
// and the other tenants still create theirs. The limits hold for new sessions; closing one gives
// its share back; reservations made at once pass it no more than one at a time.

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/admission.h"
#include "server/engine/engine.h"
#include "server/engine/memory_budget.h"
#include "server/engine/shared_segments.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

SessionConfig Of(const std::string& owner, const std::string& name) {
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.owner = owner;
  config.name = name;
  return config;
}

std::unique_ptr<Engine> EngineWith(int max_sessions_per_owner, double owner_memory_share,
                                   int64_t memory_budget) {
  EngineOptions options;
  options.device.num_threads = 1;
  options.max_sessions_per_owner = max_sessions_per_owner;
  options.owner_memory_share = owner_memory_share;
  options.memory_budget = memory_budget;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  EXPECT_THAT(engine.status(), IsOk());
  return engine.ok() ? *std::move(engine) : nullptr;
}

TEST(OwnerShareTest, AnOwnerHoldsAtMostItsSessionsAndOthersStillCreate) {
  auto engine = EngineWith(/*max_sessions_per_owner=*/2, 1.0, int64_t{1} << 30);
  ASSERT_NE(engine, nullptr);
  ASSERT_THAT(engine->CreateSession(Of("mallory", "a")).status(), IsOk());
  ASSERT_THAT(engine->CreateSession(Of("mallory", "b")).status(), IsOk());
  EXPECT_THAT(engine->CreateSession(Of("mallory", "c")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "owner 'mallory' holds 2 sessions on rank 0; the limit per owner is 2 "
                       "(--max_sessions_per_owner)"));
  EXPECT_THAT(engine->CheckAdmission(Of("mallory", "c")),
              StatusIs(absl::StatusCode::kResourceExhausted, "owner 'mallory' holds 2 sessions"));
  // A restored session was admitted before: its owner's share is not checked again.
  EXPECT_THAT(engine->CheckAdmission(Of("mallory", "c"), /*new_session=*/false), IsOk());
  // Attaching to one of its own sessions by name is no new session.
  absl::StatusOr<Engine::Created> again = engine->CreateSession(Of("mallory", "a"));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_TRUE(again->attached);
  ASSERT_THAT(engine->CreateSession(Of("alice", "a")).status(), IsOk());
  ASSERT_THAT(engine->CreateSession(Of("alice", "b")).status(), IsOk());
  // Closing one gives its place back.
  ASSERT_THAT(engine->CloseSession(again->session->id()), IsOk());
  EXPECT_THAT(engine->CreateSession(Of("mallory", "c")).status(), IsOk());
}

class OwnerShareOfTheBudgetTest : public testing::TestWithParam<std::string> {};

// The engine's empty owner name has one share like any owner (over RPC, a caller without
// authentication is the owner "anonymous"); before, the ledger left its bytes out.
INSTANTIATE_TEST_SUITE_P(NamedAndEmpty, OwnerShareOfTheBudgetTest, testing::Values("mallory", ""));

TEST_P(OwnerShareOfTheBudgetTest, AnOwnerTakesAtMostItsShareOfTheBudget) {
  const std::string& owner = GetParam();
  // Each session reserves the same footprint; the share fits two of them, the budget many more.
  auto probe = EngineWith(0, 1.0, int64_t{1} << 30);
  ASSERT_NE(probe, nullptr);
  ASSERT_THAT(probe->CreateSession(Of("probe", "one")).status(), IsOk());
  const int64_t one = probe->memory_budget().admitted();
  ASSERT_GT(one, 0);
  const int64_t budget = 10 * one;
  auto engine = EngineWith(0, 0.25, budget);  // 2.5 sessions' worth per owner
  ASSERT_NE(engine, nullptr);
  ASSERT_THAT(engine->CreateSession(Of(owner, "a")).status(), IsOk());
  ASSERT_THAT(engine->CreateSession(Of(owner, "b")).status(), IsOk());
  const absl::Status refused = engine->CreateSession(Of(owner, "c")).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "session 'c' needs "));
  EXPECT_THAT(refused.message(),
              testing::HasSubstr(absl::StrCat("; the sessions of ", OwnerName(owner), " hold ",
                                              2 * one, " of the ", budget / 4,
                                              " bytes one owner may take (--owner_memory_share "
                                              "0.25 of the rank's budget of ",
                                              budget, ")")));
  EXPECT_EQ(engine->memory_budget().admitted(), 2 * one) << "the refused session reserved bytes";
  // Another owner has a share of its own.
  ASSERT_THAT(engine->CreateSession(Of("alice", "a")).status(), IsOk());
  ASSERT_THAT(engine->CreateSession(Of("alice", "b")).status(), IsOk());
}

// What a session's streams stage or hold apart from its footprint (an InitParameters stream of a
// further trainer, an export beyond the first ones) is its owner's too. Before, it was taken from
// the rank's budget as no one's, and one owner's streams could fill the rank past its share.
TEST(OwnerShareTest, MemoryAStreamReservesIsItsOwnersWithinItsShare) {
  auto probe = EngineWith(0, 1.0, int64_t{1} << 30);
  ASSERT_NE(probe, nullptr);
  ASSERT_THAT(probe->CreateSession(Of("probe", "one")).status(), IsOk());
  const int64_t one = probe->memory_budget().admitted();
  auto engine = EngineWith(0, 0.25, 10 * one);  // 2.5 sessions' worth per owner
  ASSERT_NE(engine, nullptr);
  ASSERT_THAT(engine->CreateSession(Of("mallory", "a")).status(), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation staged,
                               engine->ReserveMemory(one, "InitParameters", "staged", "mallory"));
  EXPECT_EQ(engine->memory_budget().HeldBy("mallory"), 2 * one);
  EXPECT_THAT(
      engine->ReserveMemory(one, "ExportStateDict", "a copy", "mallory").status(),
      StatusIs(absl::StatusCode::kResourceExhausted, absl::StrCat("ExportStateDict needs ", one,
                                                                  " bytes on rank 0; the sessions "
                                                                  "of owner 'mallory' hold ",
                                                                  2 * one)));
  EXPECT_THAT(engine->ReserveMemory(one, "ExportStateDict", "a copy", "alice").status(), IsOk());
  staged.Release();
  EXPECT_THAT(engine->ReserveMemory(one, "ExportStateDict", "a copy", "mallory").status(), IsOk());
}

// A session closed while a call still holds it (a stream its tenant keeps open) keeps its bytes
// until it is destroyed: they count against the rank's budget and its owner's share until then.
// Before, the close gave them back at once, and a tenant that closed and created sessions while
// holding a stream on each could make the rank hold every session it had ever made.
TEST(OwnerShareTest, AClosedSessionACallStillHoldsKeepsItsBytesUntilItIsFreed) {
  auto probe = EngineWith(0, 1.0, int64_t{1} << 30);
  ASSERT_NE(probe, nullptr);
  ASSERT_THAT(probe->CreateSession(Of("probe", "one")).status(), IsOk());
  const int64_t one = probe->memory_budget().admitted();
  auto engine = EngineWith(0, 0.5, 4 * one);  // two sessions' worth per owner
  ASSERT_NE(engine, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created a, engine->CreateSession(Of("mallory", "a")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created b, engine->CreateSession(Of("mallory", "b")));
  std::shared_ptr<Session> held = a.session;  // as a stream of the session does
  a.session.reset();
  ASSERT_THAT(engine->CloseSession(held->id()), IsOk());
  EXPECT_EQ(engine->memory_budget().admitted(), 2 * one);
  EXPECT_EQ(engine->memory_budget().HeldBy("mallory"), 2 * one);
  EXPECT_THAT(engine->CreateSession(Of("mallory", "c")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "session 'c' needs "));
  held.reset();  // the stream ends: the session is freed, and its bytes with it
  EXPECT_EQ(engine->memory_budget().admitted(), one);
  EXPECT_EQ(engine->memory_budget().HeldBy("mallory"), one);
  EXPECT_THAT(engine->CreateSession(Of("mallory", "c")).status(), IsOk());
  EXPECT_EQ(engine->memory_budget().HeldBy("alice"), 0);
}

// The memory a rank shares with a session's trainers counts in its owner's share: a session of
// many trainers that attaches a segment for each stops at the share, and another owner still
// creates its session. Before, the segments were taken from the rank's budget past the share,
// until none was left for any other tenant.
TEST(OwnerShareTest, SharedMemoryCountsInTheOwnersShare) {
  // Sessions whose segments are about as large as their footprint: budget and share in both.
  const auto spec = [](const std::string& owner, const std::string& name) {
    SessionConfig config = Of(owner, name);
    config.params = {ParamInfo{"w", {256, 256}}};
    config.mode = GradientMode::kReplicated;
    config.num_trainers = 64;
    return config;
  };
  auto probe = EngineWith(0, 1.0, int64_t{1} << 30);
  ASSERT_NE(probe, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created sized, probe->CreateSession(spec("probe", "p")));
  const int64_t session = probe->memory_budget().admitted();
  const int64_t segment =
      SharedSegments::BytesFor(sized.session->config().params, sized.session->layout(), 0);
  ASSERT_LT(segment, session);
  // The share fits the session and one segment, and so does what is left of the budget.
  auto engine = EngineWith(0, 0.5, 2 * (session + segment));
  ASSERT_NE(engine, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created many, engine->CreateSession(spec("mallory", "m")));
  absl::Status attached;
  int segments = 0;
  while (attached.ok() && segments < 64) {
    attached = engine->AttachSharedMemory(*many.session, segments).status();
    if (attached.ok()) ++segments;
  }
  EXPECT_THAT(attached, StatusIs(absl::StatusCode::kResourceExhausted,
                                 "the sessions of owner 'mallory' hold"));
  EXPECT_EQ(segments, 1);
  EXPECT_THAT(engine->CreateSession(spec("alice", "a")).status(), IsOk());
}

// One owner's trainers hold at most its share of the segments the rank shares (each a
// descriptor): before, a session of many trainers could take every one, and every other tenant's
// trainers stepped through their streams.
TEST(OwnerShareTest, AnOwnerHoldsAtMostItsShareOfTheSharedSegments) {
  EngineOptions options;
  options.device.num_threads = 1;
  options.owner_memory_share = 0.5;
  options.memory_budget = int64_t{1} << 30;
  options.max_shared_segments = 4;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Create(options));
  const auto replicated = [](const std::string& owner, const std::string& name) {
    SessionConfig config = Of(owner, name);
    config.mode = GradientMode::kReplicated;
    config.num_trainers = 8;
    return config;
  };
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created many,
                               engine->CreateSession(replicated("mallory", "m")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Engine::Created other,
                               engine->CreateSession(replicated("alice", "a")));
  ASSERT_THAT(engine->AttachSharedMemory(*many.session, 0).status(), IsOk());
  ASSERT_THAT(engine->AttachSharedMemory(*many.session, 1).status(), IsOk());
  EXPECT_THAT(engine->AttachSharedMemory(*many.session, 2).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("owner 'mallory' holds 2 memory segments shared with trainers "
                                    "on rank 0, the most one owner may (--owner_memory_share 0.5 "
                                    "of --max_shared_segments 4); trainer 2 of session '",
                                    many.session->id(), "' steps through its stream")));
  // A trainer attaching again replaces its own segment.
  EXPECT_THAT(engine->AttachSharedMemory(*many.session, 1).status(), IsOk());
  EXPECT_THAT(engine->AttachSharedMemory(*other.session, 0).status(), IsOk());
  EXPECT_THAT(engine->AttachSharedMemory(*other.session, 1).status(), IsOk());
}

TEST(OwnerShareTest, WithoutLimitsAnOwnerMayFillTheRank) {
  auto engine = EngineWith(0, 1.0, int64_t{1} << 30);
  ASSERT_NE(engine, nullptr);
  for (int i = 0; i < 8; ++i) {
    ASSERT_THAT(engine->CreateSession(Of("", absl::StrCat("s", i))).status(), IsOk());
  }
}

TEST(OwnerShareTest, TheMessageNamesTheAnonymousOwner) {
  EXPECT_THAT(
      CheckOwnerShare("", "session 'x'", 1, OwnerHoldings{3, 0}, OwnerLimits{3, 1.0}, 100, 2),
      StatusIs(absl::StatusCode::kResourceExhausted,
               "the anonymous owner holds 3 sessions on rank 2"));
  EXPECT_THAT(
      CheckOwnerShare("bob", "session 'x'", 50, OwnerHoldings{1, 50}, OwnerLimits{0, 1.0}, 100, 0),
      IsOk());
  EXPECT_THAT(
      CheckOwnerShare("bob", "session 'x'", 50, OwnerHoldings{1, 50}, OwnerLimits{0, 0.5}, 100, 0),
      StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(
      CheckOwnerShare("bob", "session 'x'", 25, OwnerHoldings{1, 25}, OwnerLimits{0, 0.5}, 100, 0),
      IsOk());
}

// Two reservations of one owner made at once, each within its share alone but not together: at
// most one is taken. (The share was checked, then the bytes reserved, under two locks: both
// could find the owner holding nothing, and both reserve.) Each round starts the two threads
// together at a spinning gate, so that the window between the two was often met.
TEST(OwnerShareTest, ReservationsMadeAtOnceDoNotPassTheShareTogether) {
  MemoryBudget budget(1000, 0);
  constexpr int kRounds = 2000;
  int both_taken = 0;
  int none_taken = 0;
  int64_t most_held = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int> arrived{0};
    absl::StatusOr<MemoryBudget::Reservation> taken[2];
    auto reserve = [&](int i) {
      arrived.fetch_add(1);
      while (arrived.load() < 2) {
      }
      taken[i] = ReserveAsOwner(budget, 300, "an export", "its snapshot", "bob", 0.5, 0);
    };
    std::thread other(reserve, 1);
    reserve(0);
    other.join();
    if (taken[0].ok() && taken[1].ok()) ++both_taken;
    if (!taken[0].ok() && !taken[1].ok()) ++none_taken;
    most_held = std::max(most_held, budget.HeldBy("bob"));
  }
  EXPECT_EQ(both_taken, 0) << "of " << kRounds << " rounds";
  EXPECT_EQ(none_taken, 0) << "of " << kRounds << " rounds";
  EXPECT_LE(most_held, 500);
  EXPECT_EQ(budget.HeldBy("bob"), 0);
}

}  // namespace
}  // namespace optstep
