#include "client/cpp/session_pages.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace client_internal {
namespace {

// Appends the parameters, owners and group members of `page` to `info` and takes its counters.
absl::Status Append(v1::SessionInfo& page, v1::SessionInfo& info) {
  if (page.groups_size() != info.groups_size()) {
    return absl::InternalError(absl::StrCat("session '", info.session_id(), "': the page at ",
                                            page.layout_offset(), " has ", page.groups_size(),
                                            " groups, the first page ", info.groups_size()));
  }
  for (v1::ParameterSpec& param : *page.mutable_spec()->mutable_parameters()) {
    info.mutable_spec()->add_parameters()->Swap(&param);
  }
  info.mutable_layout()->mutable_owner()->Add(page.layout().owner().begin(),
                                              page.layout().owner().end());
  for (int g = 0; g < page.groups_size(); ++g) {
    const auto& ids = page.groups(g).param_ids();
    info.mutable_groups(g)->mutable_param_ids()->Add(ids.begin(), ids.end());
  }
  info.set_step(page.step());
  info.set_skipped_steps(page.skipped_steps());
  info.set_param_bytes(page.param_bytes());
  info.set_state_bytes(page.state_bytes());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::SessionInfo> ReadSession(absl::string_view session_id,
                                            const FetchSessionPage& fetch) {
  v1::SessionInfo info;
  uint64_t have = 0;
  for (bool first = true;; first = false) {
    v1::GetSessionRequest request;
    request.set_session_id(std::string(session_id));
    request.set_layout_offset(have);
    v1::SessionInfo page;
    OPTSTEP_RETURN_IF_ERROR(fetch(request, &page));
    if (page.layout_offset() != have) {
      return absl::InternalError(absl::StrCat("session '", session_id,
                                              "': asked for the layout at ", have, ", answered at ",
                                              page.layout_offset()));
    }
    const uint64_t added = page.spec().parameters_size();
    if (first) {
      info = std::move(page);
    } else {
      OPTSTEP_RETURN_IF_ERROR(Append(page, info));
    }
    have += added;
    if (have >= info.num_parameters()) break;
    if (added == 0) {
      return absl::InternalError(absl::StrCat("session '", session_id, "': the layout at ", have,
                                              " of ", info.num_parameters(),
                                              " parameters answered none"));
    }
  }
  return info;
}

absl::StatusOr<std::vector<v1::SessionSummary>> ListAllSessions(uint32_t page_size,
                                                                const FetchSessionsPage& fetch) {
  std::vector<v1::SessionSummary> sessions;
  v1::ListSessionsRequest request;
  request.set_page_size(page_size);
  while (true) {
    v1::ListSessionsResponse page;
    OPTSTEP_RETURN_IF_ERROR(fetch(request, &page));
    for (v1::SessionSummary& s : *page.mutable_sessions()) sessions.push_back(std::move(s));
    if (page.next_page_token().empty()) return sessions;
    if (page.next_page_token() == request.page_token()) {
      return absl::InternalError(
          absl::StrCat("ListSessions answered its page token '", request.page_token(), "' again"));
    }
    request.set_page_token(page.next_page_token());
  }
}

}  // namespace client_internal
}  // namespace optstep
