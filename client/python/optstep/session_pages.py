"""Reading what the server answers in pages.

GetSession answers one page of a session's layout (``layout_offset``, ``num_parameters``);
:func:`read_session` puts the pages back into one whole ``SessionInfo``. ListSessions answers
summaries a page at a time; :func:`list_all_sessions` follows ``next_page_token`` to the end.
"""

from __future__ import annotations

from typing import Callable, List

from optstep.errors import InternalError
from optstep.v1 import optimizer_service_pb2 as svc_pb2
from optstep.v1 import session_pb2

FetchSessionPage = Callable[[svc_pb2.GetSessionRequest], session_pb2.SessionInfo]
FetchSessionsPage = Callable[[svc_pb2.ListSessionsRequest], svc_pb2.ListSessionsResponse]


def _append(info: session_pb2.SessionInfo, page: session_pb2.SessionInfo) -> None:
    if len(page.groups) != len(info.groups):
        raise InternalError(f"session '{info.session_id}': the page at {page.layout_offset} has "
                            f"{len(page.groups)} groups, the first page {len(info.groups)}")
    info.spec.parameters.extend(page.spec.parameters)
    info.layout.owner.extend(page.layout.owner)
    for whole, part in zip(info.groups, page.groups):
        whole.param_ids.extend(part.param_ids)
    info.step = page.step
    info.skipped_steps = page.skipped_steps
    info.param_bytes = page.param_bytes
    info.state_bytes = page.state_bytes


def read_session(session_id: str, fetch: FetchSessionPage) -> session_pb2.SessionInfo:
    """The whole SessionInfo of `session_id` from its GetSession pages.

    InternalError when a page does not continue the previous one or adds nothing before the end.
    """
    info = session_pb2.SessionInfo()
    have = 0
    first = True
    while True:
        page = fetch(svc_pb2.GetSessionRequest(session_id=session_id, layout_offset=have))
        if page.layout_offset != have:
            raise InternalError(f"session '{session_id}': asked for the layout at {have}, "
                                f"answered at {page.layout_offset}")
        added = len(page.spec.parameters)
        if first:
            info.CopyFrom(page)
            first = False
        else:
            _append(info, page)
        have += added
        if have >= info.num_parameters:
            return info
        if added == 0:
            raise InternalError(f"session '{session_id}': the layout at {have} of "
                                f"{info.num_parameters} parameters answered none")


def list_all_sessions(fetch: FetchSessionsPage,
                      page_size: int = 0) -> List[session_pb2.SessionSummary]:
    """Every session of every ListSessions page, `page_size` (0: the server's default) a page."""
    sessions: List[session_pb2.SessionSummary] = []
    request = svc_pb2.ListSessionsRequest(page_size=page_size)
    while True:
        page = fetch(request)
        sessions.extend(page.sessions)
        if not page.next_page_token:
            return sessions
        if page.next_page_token == request.page_token:
            raise InternalError(
                f"ListSessions answered its page token '{request.page_token}' again")
        request = svc_pb2.ListSessionsRequest(page_size=page_size,
                                              page_token=page.next_page_token)
