#ifndef OPTSTEP_CLIENT_CPP_SESSION_PAGES_H_
#define OPTSTEP_CLIENT_CPP_SESSION_PAGES_H_

// Reading what the server answers in pages: a session's whole SessionInfo from its GetSession
// pages, and every visible session from the ListSessions pages. Each function calls `fetch` once
// per page, in order, on the calling thread; it holds no state of its own.

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "optstep/v1/session.pb.h"

namespace optstep {
namespace client_internal {

using FetchSessionPage =
    std::function<absl::Status(const v1::GetSessionRequest& request, v1::SessionInfo* page)>;
using FetchSessionsPage = std::function<absl::Status(const v1::ListSessionsRequest& request,
                                                     v1::ListSessionsResponse* page)>;

// The whole SessionInfo of `session_id` (every parameter, owner and group member; the counters
// of the last page). INTERNAL when a page does not continue the previous one or adds nothing
// before the end, or when the pages disagree on the groups.
absl::StatusOr<v1::SessionInfo> ReadSession(absl::string_view session_id,
                                            const FetchSessionPage& fetch);

// The summaries of every page, `page_size` (0: the server's default) at a time, in the server's
// order. INTERNAL when a page answers the token it was asked with (it would never end).
absl::StatusOr<std::vector<v1::SessionSummary>> ListAllSessions(uint32_t page_size,
                                                                const FetchSessionsPage& fetch);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_SESSION_PAGES_H_
