// The memory budget: how it is found (flag, device, cgroup, physical memory), how byte counts and
// cgroup files parse, and the ledger of admitted bytes (reserve, refuse with the bytes named,
// release when a reservation goes).

#include "server/engine/memory_budget.h"

#include <memory>
#include <optional>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

TEST(MemoryBudgetTest, ReservesUntilTheBudgetAndRefusesNamingTheBytes) {
  MemoryBudget budget(1000, 2);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation a,
                               budget.TryReserve(600, "session 'a'", "x"));
  EXPECT_EQ(budget.admitted(), 600);
  EXPECT_THAT(budget.TryReserve(401, "session 'b'", "masters 401").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "session 'b' needs 401 bytes on rank 2 (masters 401), more than the rank's "
                       "budget of 1000 bytes has free"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation b,
                               budget.TryReserve(400, "session 'b'", "x"));
  EXPECT_EQ(budget.admitted(), 1000);
  MemoryBudget::Reservation moved = std::move(a);
  EXPECT_EQ(budget.admitted(), 1000);  // a move keeps the bytes reserved
  moved.Release();
  EXPECT_EQ(budget.admitted(), 400);
  { MemoryBudget::Reservation gone = std::move(b); }
  EXPECT_EQ(budget.admitted(), 0);
}

// A stand-in's budget shares its host's (both ranks' memory is the one machine's): what either
// admits counts against both, each as it comes, and a refusal says the budget is shared.
TEST(MemoryBudgetTest, AStandInSharesItsHostsBudgetBothWays) {
  auto host = std::make_unique<MemoryBudget>(1000, 2);
  MemoryBudget stand_in(*host, 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation hosts,
                               host->TryReserve(300, "session 'h'", "x"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation its,
                               stand_in.TryReserve(500, "session 's'", "x"));
  EXPECT_EQ(host->admitted(), 800);
  EXPECT_EQ(stand_in.admitted(), 800);
  EXPECT_EQ(stand_in.budget(), 1000);
  EXPECT_THAT(stand_in.TryReserve(201, "session 't'", "masters 201").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "session 't' needs 201 bytes on rank 1 (masters 201), more than the rank's "
                       "budget of 1000 bytes has free (shared with rank 2, which it stands in "
                       "beside)"));
  EXPECT_THAT(host->TryReserve(201, "session 'u'", "x").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "1000 bytes has free"));
  its.Release();
  EXPECT_EQ(host->admitted(), 300);
  host.reset();  // the host may go first
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation more,
                               stand_in.TryReserve(700, "session 's'", "x"));
  EXPECT_EQ(stand_in.admitted(), 1000);
}

// An owner's bytes are counted across the budgets that share a ledger: its sessions' parts on a
// stand-in and on its host are one machine's memory, and its share of it (--owner_memory_share)
// is checked against their sum. Before, each rank counted only its own part, and one owner could
// take twice its share of the host.
TEST(MemoryBudgetTest, AnOwnersBytesAreCountedAcrossAStandInAndItsHost) {
  MemoryBudget host(1000, 2);
  MemoryBudget stand_in(host, 1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation hosts,
                               host.TryReserve(300, "session 'h'", "x", "mallory"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation its,
                               stand_in.TryReserve(200, "session 'h'", "x", "mallory"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation alices,
                               stand_in.TryReserve(100, "session 'a'", "x", "alice"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(MemoryBudget::Reservation nobodys,
                               host.TryReserve(50, "an export", "x"));
  EXPECT_EQ(host.HeldBy("mallory"), 500);
  EXPECT_EQ(stand_in.HeldBy("mallory"), 500);
  EXPECT_EQ(host.HeldBy("alice"), 100);
  EXPECT_EQ(host.admitted(), 650);
  MemoryBudget::Reservation moved = std::move(its);
  its.Release();  // moved from: holds nothing
  EXPECT_EQ(host.HeldBy("mallory"), 500);
  moved.Release();
  EXPECT_EQ(host.HeldBy("mallory"), 300);
  hosts.Release();
  EXPECT_EQ(stand_in.HeldBy("mallory"), 0);
  EXPECT_EQ(host.admitted(), 150);
}

// The headroom holds streams' copies while they fit together, shared with a stand-in's budget,
// and gives their bytes back as each goes; none is granted without one. An owner holds no more
// than it is let there: one tenant's copies cannot take the headroom from the others.
TEST(MemoryBudgetTest, TheHeadroomHoldsCopiesWhileTheyFitTogether) {
  MemoryBudget host(1000, /*rank=*/1);
  EXPECT_FALSE(host.TryTakeHeadroom(1, "a", 100).has_value()) << "no headroom set";
  host.set_headroom(100);
  MemoryBudget stand_in(host, /*rank=*/0);
  EXPECT_EQ(stand_in.headroom(), 100);
  std::optional<MemoryBudget::HeadroomBytes> first = host.TryTakeHeadroom(60, "a", 100);
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(stand_in.TryTakeHeadroom(41, "b", 100).has_value()) << "60 + 41 > 100";
  EXPECT_FALSE(host.TryTakeHeadroom(10, "a", 65).has_value()) << "a holds 60 of its 65";
  std::optional<MemoryBudget::HeadroomBytes> second = stand_in.TryTakeHeadroom(40, "b", 50);
  ASSERT_TRUE(second.has_value());
  first.reset();
  EXPECT_TRUE(host.TryTakeHeadroom(60, "a", 60).has_value()) << "the first copy's bytes came back";
  EXPECT_EQ(host.admitted(), 0) << "the headroom is not the budget";
}

TEST(MemoryBudgetTest, ByteCountsTakeBinarySuffixes) {
  EXPECT_EQ(*ParseByteCount("--memory_budget", "1048576"), 1048576);
  EXPECT_EQ(*ParseByteCount("--memory_budget", "512M"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteCount("--memory_budget", "3g"), int64_t{3} << 30);
  EXPECT_EQ(*ParseByteCount("--memory_budget", "2T"), int64_t{2} << 40);
  for (const char* bad : {"", "-1G", "3X", "G", "99999999999T", "1.5G"}) {
    EXPECT_THAT(ParseByteCount("--memory_budget", bad).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "--memory_budget: '"))
        << bad;
  }
}

TEST(MemoryBudgetTest, CgroupFilesWithoutALimitAnswerNone) {
  EXPECT_EQ(ParseCgroupMemoryLimit("3221225472\n"), int64_t{3} << 30);
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), 0);
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), 0);  // v1's "no limit"
  EXPECT_EQ(ParseCgroupMemoryLimit(""), 0);
}

TEST(MemoryBudgetTest, TheFlagWinsThenTheDeviceThenTheHost) {
  EXPECT_EQ(ResolveMemoryBudget(12345, 1000).bytes, 12345);
  const MemoryLimit device = ResolveMemoryBudget(0, 1000);
  EXPECT_EQ(device.bytes, 800);
  EXPECT_EQ(device.source, "0.8 of device memory");
  const MemoryLimit host = ResolveMemoryBudget(0, 0);
  EXPECT_GT(host.bytes, 0);
  EXPECT_EQ(host.bytes,
            static_cast<int64_t>(HostMemoryLimit().bytes * kDefaultMemoryBudgetFraction));
}

}  // namespace
}  // namespace optstep
