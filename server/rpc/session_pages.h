#ifndef OPTSTEP_SERVER_RPC_SESSION_PAGES_H_
#define OPTSTEP_SERVER_RPC_SESSION_PAGES_H_

// What the session RPCs answer, in pieces whose size does not grow with the session or the number
// of sessions: a session's summary (CreateSession, ListSessions), one page of its layout
// (GetSession), one page of the caller's sessions (ListSessions); and the check that an answer
// fits the message size. Free functions of values; thread-compatible.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "optstep/v1/session.pb.h"
#include "server/engine/session.h"
#include "server/rpc/caller.h"

namespace optstep {

// Most parameters on one GetSession page (a request's layout_limit 0 or above means this).
inline constexpr uint32_t kMaxLayoutPage = 65536;
// Sessions on one ListSessions page when the request says 0, and the most it may ask for.
inline constexpr uint32_t kDefaultSessionsPage = 100;
inline constexpr uint32_t kMaxSessionsPage = 1000;

// Where a client reaches each rank of the group: the address of every rank, by rank (a stand-in's
// for the ranks in `stood_in_ranks`, docs/deploy.md "A rank that does not return").
struct RankDirectory {
  std::vector<std::string> rank_targets;
  std::vector<uint32_t> stood_in_ranks;  // ascending
};

// Fills the `rank_targets` and `stood_in_ranks` fields of `message` (a Layout, a SessionSummary,
// a ListSessionsResponse).
template <typename Message>
void RankDirectoryToProto(const RankDirectory& ranks, Message* message) {
  for (const std::string& target : ranks.rank_targets) message->add_rank_targets(target);
  for (uint32_t rank : ranks.stood_in_ranks) message->add_stood_in_ranks(rank);
}

// The summary of `session`, served by `ranks`.
void SessionSummaryToProto(const Session& session, const RankDirectory& ranks,
                           v1::SessionSummary* summary);

// One GetSession page of `session`: the definition without its parameters, the layout's world
// size and `ranks`, the groups, the counters, and the parameters (spec and owner) from
// `offset` on: at most `limit` of them (0 or over kMaxLayoutPage: kMaxLayoutPage), fewer where the
// answer would pass `max_bytes` (but at least one while any is left). OUT_OF_RANGE naming the
// session and its parameter count when `offset` is past the last parameter (the count itself is
// allowed: an empty page).
absl::Status SessionPageToProto(const Session& session, const RankDirectory& ranks, uint64_t offset,
                                uint32_t limit, size_t max_bytes, v1::SessionInfo* page);

// One ListSessions page of `sessions` (any order) as `caller` may see them: the summaries of the
// first `request.page_size()` (see kDefaultSessionsPage) sessions by id after the id in
// `request.page_token()`, next_page_token (the last id answered) when more follow, and `ranks`. A
// cursor by id covers every session that exists throughout the listing exactly once, whatever is
// created or closed between pages.
void SessionsPageToProto(const std::vector<std::shared_ptr<Session>>& sessions,
                         const Caller& caller, const v1::ListSessionsRequest& request,
                         const RankDirectory& ranks, v1::ListSessionsResponse* page);

// RESOURCE_EXHAUSTED naming `what`, the answer's encoded bytes and `max_bytes` when `answer` does
// not fit in a message of `max_bytes`.
absl::Status CheckAnswerSize(const google::protobuf::Message& answer, size_t max_bytes,
                             absl::string_view what);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_SESSION_PAGES_H_
