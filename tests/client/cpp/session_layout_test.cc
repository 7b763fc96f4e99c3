#include "client/cpp/session_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::MakeSessionInfo;
using ::optstep::testutil::StatusIs;

TEST(SessionLayoutTest, ReadsNamesSizesAndOwners) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      SessionLayout layout,
      SessionLayout::FromSessionInfo(MakeSessionInfo(
          "s", 2, {{"w", {4, 3}, 1}, {"b", {3}, 0}, {"scale", {}, 1}})));
  EXPECT_EQ(layout.session_id(), "s");
  EXPECT_EQ(layout.world_size(), 2u);
  ASSERT_EQ(layout.num_params(), 3u);
  EXPECT_EQ(layout.param(0).name, "w");
  EXPECT_EQ(layout.param(0).num_elements, 12u);
  EXPECT_EQ(layout.param(0).owner, 1u);
  EXPECT_EQ(layout.param(1).num_elements, 3u);
  EXPECT_EQ(layout.param(1).owner, 0u);
  EXPECT_EQ(layout.param(2).num_elements, 1u);  // a scalar
}

TEST(SessionLayoutTest, NoLayoutMeansOneRank) {
  v1::SessionInfo info = MakeSessionInfo("s", 0, {{"w", {2}, 0}});
  info.mutable_layout()->clear_owner();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionLayout layout, SessionLayout::FromSessionInfo(info));
  EXPECT_EQ(layout.world_size(), 1u);
  EXPECT_EQ(layout.param(0).owner, 0u);
}

TEST(SessionLayoutTest, RejectsInconsistentInfo) {
  EXPECT_THAT(SessionLayout::FromSessionInfo(MakeSessionInfo("s", 2, {{"w", {2}, 2}})),
              StatusIs(absl::StatusCode::kInternal, "param 'w' is owned by rank 2"));
  EXPECT_THAT(SessionLayout::FromSessionInfo(MakeSessionInfo("s", 1, {{"w", {2, 0}, 0}})),
              StatusIs(absl::StatusCode::kInternal, "zero dimension"));
  v1::SessionInfo short_owners = MakeSessionInfo("s", 1, {{"a", {1}, 0}, {"b", {1}, 0}});
  short_owners.mutable_layout()->mutable_owner()->RemoveLast();
  EXPECT_THAT(SessionLayout::FromSessionInfo(short_owners),
              StatusIs(absl::StatusCode::kInternal, "1 owners for 2 parameters"));
  EXPECT_THAT(SessionLayout::FromSessionInfo(
                  MakeSessionInfo("s", 1, {{"huge", {1ull << 40, 1ull << 40}, 0}})),
              StatusIs(absl::StatusCode::kInternal, "too many elements"));
}

TEST(SessionLayoutTest, CheckParamIdIsNotFound) {
  SessionLayout layout("s", 1, {{"w", 4, 0}});
  EXPECT_THAT(layout.CheckParamId(0), testutil::IsOk());
  EXPECT_THAT(layout.CheckParamId(1),
              StatusIs(absl::StatusCode::kNotFound, "param_id 1 not found: session 's' has 1"));
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
