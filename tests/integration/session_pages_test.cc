// Session answers that stay small through the real server: CreateSession of 300,000 parameters
// answers a summary at once (the whole layout used to be echoed, over the message size, after the
// session was created anyway), GetSession hands the layout out in pages that make the whole of it
// with the right owners, and ListSessions pages cover every session exactly once while sessions
// are created and closed between pages.

#include <grpcpp/create_channel.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;

constexpr int kTinyParams = 300000;

// `n` parameters of one element, named p0 .. p<n-1>; sgd.
v1::SessionSpec TinySpec(const std::string& name, int n) {
  v1::SessionSpec spec;
  spec.set_name(name);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("sgd");
  for (int i = 0; i < n; ++i) {
    v1::ParameterSpec* p = spec.add_parameters();
    p->set_name(absl::StrCat("p", i));
    p->add_shape(1);
  }
  return spec;
}

std::unique_ptr<v1::OptimizerService::Stub> Stub(const std::string& address) {
  return v1::OptimizerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// The request of 300,000 parameters is about 4.2 MB; its whole layout echoed back would be over
// the 4.5 MiB message size. The answer is a summary; the layout comes in pages.
TEST(SessionPagesTest, ManyTinyParametersAreCreatedWithASmallAnswerAndReadInPages) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      auto server, ServerProcess::Start({"--memory_budget=2G", "--max_message_bytes=4718592"}));
  const v1::SessionSpec spec = TinySpec("tiny", kTinyParams);
  auto stub = Stub(server->address());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::CreateSessionRequest request;
  *request.mutable_spec() = spec;
  v1::CreateSessionResponse created;
  const grpc::Status status = stub->CreateSession(&context, request, &created);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_LT(created.ByteSizeLong(), 1024u);
  const v1::SessionSummary& summary = created.summary();
  EXPECT_EQ(summary.name(), "tiny");
  EXPECT_EQ(summary.num_parameters(), static_cast<uint64_t>(kTinyParams));
  EXPECT_EQ(summary.world_size(), 1u);
  EXPECT_THAT(summary.rank_targets(), testing::ElementsAre(server->address()));
  EXPECT_EQ(summary.param_bytes(), 4u * kTinyParams);

  // One page holds at most 65536 parameters, fewer near the message size.
  grpc::ClientContext page_context;
  v1::GetSessionRequest first;
  first.set_session_id(summary.session_id());
  v1::SessionInfo page;
  ASSERT_TRUE(stub->GetSession(&page_context, first, &page).ok());
  EXPECT_EQ(page.num_parameters(), static_cast<uint64_t>(kTinyParams));
  EXPECT_EQ(page.spec().parameters_size(), 65536);
  EXPECT_EQ(page.layout().owner_size(), 65536);

  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->GetSession(summary.session_id()));
  ASSERT_EQ(info.spec().parameters_size(), kTinyParams);
  ASSERT_EQ(info.layout().owner_size(), kTinyParams);
  for (int i = 0; i < kTinyParams; i += 9973) {
    EXPECT_EQ(info.spec().parameters(i).name(), absl::StrCat("p", i));
    EXPECT_EQ(info.layout().owner(i), 0u);
  }
  ASSERT_EQ(info.groups_size(), 1);
  EXPECT_EQ(info.groups(0).param_ids_size(), kTinyParams);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto sessions, client->ListSessions());
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].session_id(), summary.session_id());
  EXPECT_EQ(sessions[0].num_parameters(), static_cast<uint64_t>(kTinyParams));
  EXPECT_THAT(client->CloseSession(summary.session_id()), IsOk());
}

// On two ranks, pages of 7 parameters make the same layout as one page of all: every owner, in
// order, from both ranks. A page past the end is OUT_OF_RANGE naming the count.
TEST(SessionPagesTest, SmallPagesOfATwoRankLayoutMakeTheWholeLayout) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto ranks, testutil::StartGroup(2, {}));
  ClientOptions options;
  options.rank_targets = {ranks[0]->address(), ranks[1]->address()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo whole, client->CreateSession(TinySpec("two", 50)));
  ASSERT_EQ(whole.layout().owner_size(), 50);
  EXPECT_EQ(whole.layout().world_size(), 2u);
  std::set<uint32_t> owners(whole.layout().owner().begin(), whole.layout().owner().end());
  EXPECT_EQ(owners, (std::set<uint32_t>{0, 1}));

  auto stub = Stub(ranks[0]->address());
  std::vector<uint32_t> paged;
  std::vector<std::string> names;
  for (uint64_t offset = 0; offset < 50;) {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_session_id(whole.session_id());
    request.set_layout_offset(offset);
    request.set_layout_limit(7);
    v1::SessionInfo page;
    ASSERT_TRUE(stub->GetSession(&context, request, &page).ok());
    EXPECT_EQ(page.layout_offset(), offset);
    EXPECT_EQ(page.num_parameters(), 50u);
    ASSERT_EQ(page.spec().parameters_size(), std::min<int>(7, 50 - offset));
    paged.insert(paged.end(), page.layout().owner().begin(), page.layout().owner().end());
    for (const auto& p : page.spec().parameters()) names.push_back(p.name());
    for (uint32_t id : page.groups(0).param_ids()) {
      EXPECT_GE(id, offset);
      EXPECT_LT(id, offset + 7);
    }
    offset += page.spec().parameters_size();
  }
  EXPECT_THAT(paged, testing::ElementsAreArray(whole.layout().owner()));
  ASSERT_EQ(names.size(), 50u);
  EXPECT_EQ(names[49], "p49");

  grpc::ClientContext context;
  v1::GetSessionRequest past;
  past.set_session_id(whole.session_id());
  past.set_layout_offset(51);
  v1::SessionInfo page;
  const grpc::Status refused = stub->GetSession(&context, past, &page);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(refused.error_message(), testing::HasSubstr("has 50 parameters; layout_offset 51"));
}

// Pages of 3 by id: sessions closed before the cursor reaches them are not listed, sessions that
// live throughout are listed exactly once, none twice, whatever is created in between.
TEST(SessionPagesTest, ListSessionsPagesCoverEverySessionOnceWhileSessionsComeAndGo) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto server, ServerProcess::Start({}));
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  std::set<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info,
                                 client->CreateSession(SmallSpec(absl::StrCat("s", i))));
    ids.insert(info.session_id());
  }
  std::set<std::string> throughout = ids;
  std::vector<std::string> listed;
  std::set<std::string> closed_unseen;
  v1::ListSessionsRequest request;
  request.set_page_size(3);
  for (int page_number = 0;; ++page_number) {
    v1::ListSessionsResponse page;
    ASSERT_THAT(client->ListSessionsPage(request, &page), IsOk());
    ASSERT_LE(page.sessions_size(), 3);
    for (const v1::SessionSummary& s : page.sessions()) {
      EXPECT_GT(s.session_id(), request.page_token());
      listed.push_back(s.session_id());
    }
    if (page.next_page_token().empty()) break;
    EXPECT_EQ(page.next_page_token(), listed.back());
    // Between pages: close the last session not listed yet, and one already listed; create two.
    const std::string unseen = *ids.rbegin();
    if (unseen > listed.back() && closed_unseen.size() < 2) {
      ASSERT_THAT(client->CloseSession(unseen), IsOk());
      ids.erase(unseen);
      throughout.erase(unseen);
      closed_unseen.insert(unseen);
    }
    if (page_number == 0) {
      ASSERT_THAT(client->CloseSession(listed.front()), IsOk());
      ids.erase(listed.front());
      throughout.erase(listed.front());
    }
    for (int i = 0; i < 2 && page_number < 2; ++i) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(
          v1::SessionInfo info,
          client->CreateSession(SmallSpec(absl::StrCat("new", page_number, "-", i))));
      ids.insert(info.session_id());
    }
    request.set_page_token(page.next_page_token());
  }
  const std::set<std::string> unique(listed.begin(), listed.end());
  EXPECT_EQ(unique.size(), listed.size()) << "a session was listed twice";
  for (const std::string& id : throughout) EXPECT_EQ(unique.count(id), 1u) << id;
  for (const std::string& id : closed_unseen) EXPECT_EQ(unique.count(id), 0u) << id;
  EXPECT_EQ(closed_unseen.size(), 2u);
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));

  // Without a page size one page of the default 100 holds them all; the client follows pages.
  v1::ListSessionsResponse all;
  ASSERT_THAT(client->ListSessionsPage(v1::ListSessionsRequest(), &all), IsOk());
  EXPECT_EQ(static_cast<size_t>(all.sessions_size()), ids.size());
  EXPECT_TRUE(all.next_page_token().empty());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto followed, client->ListSessions(2));
  ASSERT_EQ(followed.size(), ids.size());
  for (const v1::SessionSummary& s : followed) EXPECT_EQ(ids.count(s.session_id()), 1u);
}

}  // namespace
}  // namespace optstep
