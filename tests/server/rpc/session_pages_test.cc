// CheckAnswerSize, the last guard of the session answers: an answer over the message size is
// RESOURCE_EXHAUSTED naming what, its bytes and the size; one that fits is OK. A ListSessions page
// tells where each rank is, stand-ins included, also to a caller without sessions.

#include "server/rpc/session_pages.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(CheckAnswerSizeTest, AnAnswerOverTheMessageSizeIsRefusedNamingItsBytes) {
  v1::CreateSessionResponse answer;
  answer.mutable_summary()->set_session_id(std::string(100, 's'));
  const size_t bytes = answer.ByteSizeLong();
  EXPECT_THAT(CheckAnswerSize(answer, bytes, "the answer"), IsOk());
  EXPECT_THAT(CheckAnswerSize(answer, bytes - 1, "the answer of 's'"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("the answer of 's' is ", bytes,
                                    " bytes, over the message size of ", bytes - 1)));
}

TEST(SessionsPageTest, TellsWhereEachRankIsToACallerWithoutSessions) {
  const RankDirectory ranks{{"a:1", "stand-in:2", "c:3"}, {1}};
  v1::ListSessionsResponse page;
  SessionsPageToProto({}, Caller{}, v1::ListSessionsRequest(), ranks, &page);
  EXPECT_EQ(page.sessions_size(), 0);
  ASSERT_EQ(page.rank_targets_size(), 3);
  EXPECT_EQ(page.rank_targets(1), "stand-in:2");
  ASSERT_EQ(page.stood_in_ranks_size(), 1);
  EXPECT_EQ(page.stood_in_ranks(0), 1u);
}

}  // namespace
}  // namespace optstep
