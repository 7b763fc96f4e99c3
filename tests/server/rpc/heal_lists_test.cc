// A restarted rank 0 heals itself in only from survivors that list the same sessions at the same
// resolutions (SameSessionsOnSurvivors): a creation or a close cut by the loss of rank 0 reached
// only some of them, and a heal from one rank's list would leave the others waiting in the
// rendezvous until the timeout. The first session that differs is named.

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/rpc/heal.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

// A survivor's list: sessions (id, resolutions) in id order.
v1::ListReplicasResponse Listed(const std::vector<std::pair<std::string, uint64_t>>& sessions) {
  v1::ListReplicasResponse list;
  list.set_awaits_rank_zero(true);
  for (const auto& [id, resolutions] : sessions) {
    v1::CreateReplicaRequest* replica = list.add_replicas();
    replica->set_session_id(id);
    replica->set_resolutions(resolutions);
  }
  return list;
}

TEST(HealListsTest, TheSameSessionsAtTheSameResolutionsHeal) {
  const v1::ListReplicasResponse list = Listed({{"a", 4}, {"b", 0}});
  EXPECT_THAT(SameSessionsOnSurvivors({v1::ListReplicasResponse(), list, list, list}), IsOk());
  EXPECT_THAT(SameSessionsOnSurvivors({v1::ListReplicasResponse(), Listed({}), Listed({})}),
              IsOk());
}

TEST(HealListsTest, ASessionOnlySomeSurvivorsHoldIsNamed) {
  // A creation cut after rank 1 made its replica, before rank 2 did.
  EXPECT_THAT(SameSessionsOnSurvivors(
                  {v1::ListReplicasResponse(), Listed({{"a", 4}, {"b", 0}}), Listed({{"a", 4}})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "session 'b' is on rank 1 but not on rank 2"));
  // A close cut after rank 1 dropped its replica.
  EXPECT_THAT(SameSessionsOnSurvivors(
                  {v1::ListReplicasResponse(), Listed({{"b", 0}}), Listed({{"a", 4}, {"b", 0}})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "session 'a' is on rank 2 but not on rank 1"));
  EXPECT_THAT(SameSessionsOnSurvivors({v1::ListReplicasResponse(), Listed({{"a", 4}}),
                                       Listed({{"a", 4}}), Listed({{"a", 4}, {"c", 1}})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "session 'c' is on rank 3 but not on rank 1"));
}

TEST(HealListsTest, ASessionAtAnotherResolutionIsNamed) {
  EXPECT_THAT(SameSessionsOnSurvivors({v1::ListReplicasResponse(), Listed({{"a", 4}, {"b", 2}}),
                                       Listed({{"a", 4}, {"b", 3}})}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "session 'b' finished 2 resolutions on rank 1 and 3 on rank 2"));
}

}  // namespace
}  // namespace optstep
