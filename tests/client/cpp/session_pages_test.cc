// ReadSession puts a session's GetSession pages back together (parameters, owners, group members,
// the last page's counters) and refuses pages that do not continue each other; ListAllSessions
// follows next_page_token to the end and refuses a token that does not move.

#include "client/cpp/session_pages.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace client_internal {
namespace {

using ::optstep::testutil::StatusIs;

// Five parameters over two ranks in two groups (even ids and odd ids), step 7.
v1::SessionInfo Whole() {
  v1::SessionInfo info;
  info.set_session_id("s");
  info.mutable_spec()->set_name("model");
  info.mutable_layout()->set_world_size(2);
  info.add_groups()->set_id(0);
  info.add_groups()->set_id(1);
  for (int i = 0; i < 5; ++i) {
    v1::ParameterSpec* p = info.mutable_spec()->add_parameters();
    p->set_name("p" + std::to_string(i));
    p->add_shape(i + 1);
    info.mutable_layout()->add_owner(i % 2);
    info.mutable_groups(i % 2)->add_param_ids(i);
  }
  info.set_step(7);
  info.set_num_parameters(5);
  return info;
}

// The server's pages of `whole`, `per_page` parameters each.
v1::SessionInfo Page(const v1::SessionInfo& whole, uint64_t offset, int per_page) {
  v1::SessionInfo page = whole;
  page.mutable_spec()->clear_parameters();
  page.mutable_layout()->clear_owner();
  for (v1::GroupInfo& g : *page.mutable_groups()) g.clear_param_ids();
  page.set_layout_offset(offset);
  for (uint64_t i = offset; i < whole.num_parameters() && i < offset + per_page; ++i) {
    *page.mutable_spec()->add_parameters() = whole.spec().parameters(i);
    page.mutable_layout()->add_owner(whole.layout().owner(i));
    page.mutable_groups(i % 2)->add_param_ids(i);
  }
  return page;
}

TEST(ReadSessionTest, PagesMakeTheWholeSession) {
  const v1::SessionInfo whole = Whole();
  std::vector<uint64_t> asked;
  auto read = ReadSession("s", [&](const v1::GetSessionRequest& request, v1::SessionInfo* page) {
    asked.push_back(request.layout_offset());
    *page = Page(whole, request.layout_offset(), 2);
    return absl::OkStatus();
  });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(asked, testing::ElementsAre(0, 2, 4));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*read, whole))
      << read->DebugString();
}

TEST(ReadSessionTest, AnEmptySessionIsOnePage) {
  v1::SessionInfo empty;
  empty.set_session_id("e");
  int calls = 0;
  auto read = ReadSession("e", [&](const v1::GetSessionRequest&, v1::SessionInfo* page) {
    ++calls;
    *page = empty;
    return absl::OkStatus();
  });
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(calls, 1);
}

TEST(ReadSessionTest, APageAtAnotherOffsetOrWithoutParametersIsRefused) {
  const v1::SessionInfo whole = Whole();
  EXPECT_THAT(ReadSession("s",
                          [&](const v1::GetSessionRequest&, v1::SessionInfo* page) {
                            *page = Page(whole, 0, 2);  // always the first page
                            return absl::OkStatus();
                          }),
              StatusIs(absl::StatusCode::kInternal, "asked for the layout at 2, answered at 0"));
  EXPECT_THAT(ReadSession("s",
                          [&](const v1::GetSessionRequest& request, v1::SessionInfo* page) {
                            *page = Page(whole, request.layout_offset(),
                                         request.layout_offset() == 0 ? 2 : 0);
                            return absl::OkStatus();
                          }),
              StatusIs(absl::StatusCode::kInternal, "the layout at 2 of 5 parameters"));
}

TEST(ReadSessionTest, AnErrorOfAPageIsAnswered) {
  EXPECT_THAT(ReadSession("s",
                          [](const v1::GetSessionRequest&, v1::SessionInfo*) {
                            return absl::NotFoundError("session 's' not found");
                          }),
              StatusIs(absl::StatusCode::kNotFound, "session 's' not found"));
}

TEST(ListAllSessionsTest, FollowsTheTokensToTheLastPage) {
  std::vector<std::string> tokens;
  auto all = ListAllSessions(
      2, [&](const v1::ListSessionsRequest& request, v1::ListSessionsResponse* page) {
        EXPECT_EQ(request.page_size(), 2u);
        tokens.push_back(request.page_token());
        const int first = request.page_token().empty() ? 0 : std::stoi(request.page_token()) + 1;
        for (int i = first; i < 5 && i < first + 2; ++i) {
          page->add_sessions()->set_session_id(std::to_string(i));
        }
        if (first + 2 < 5) page->set_next_page_token(std::to_string(first + 1));
        return absl::OkStatus();
      });
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*all)[i].session_id(), std::to_string(i));
  EXPECT_THAT(tokens, testing::ElementsAre("", "1", "3"));
}

TEST(ListAllSessionsTest, ATokenThatDoesNotMoveIsRefused) {
  EXPECT_THAT(ListAllSessions(0,
                              [](const v1::ListSessionsRequest&, v1::ListSessionsResponse* page) {
                                page->set_next_page_token("same");
                                return absl::OkStatus();
                              }),
              StatusIs(absl::StatusCode::kInternal, "answered its page token 'same' again"));
}

}  // namespace
}  // namespace client_internal
}  // namespace optstep
