"""Sessions read in pages: read_session puts GetSession pages back together, list_all_sessions
follows the ListSessions tokens; against the real server the client lists every session once
whatever the page size, and create_session answers the whole layout."""

from __future__ import annotations

from typing import List

import pytest

import optstep
from optstep import config, pb
from optstep.errors import InternalError
from optstep.session_pages import list_all_sessions, read_session
from optstep.v1 import optimizer_service_pb2 as svc


def _whole() -> pb.SessionInfo:
    """Five parameters over two ranks in two groups (even and odd ids), step 7."""
    info = pb.SessionInfo(session_id="s", num_parameters=5, step=7)
    info.layout.world_size = 2
    info.groups.add(id=0)
    info.groups.add(id=1)
    for i in range(5):
        info.spec.parameters.add(name=f"p{i}", shape=[i + 1])
        info.layout.owner.append(i % 2)
        info.groups[i % 2].param_ids.append(i)
    return info


def _page(whole: pb.SessionInfo, offset: int, per_page: int) -> pb.SessionInfo:
    page = pb.SessionInfo()
    page.CopyFrom(whole)
    del page.spec.parameters[:]
    del page.layout.owner[:]
    for group in page.groups:
        del group.param_ids[:]
    page.layout_offset = offset
    for i in range(offset, min(whole.num_parameters, offset + per_page)):
        page.spec.parameters.append(whole.spec.parameters[i])
        page.layout.owner.append(whole.layout.owner[i])
        page.groups[i % 2].param_ids.append(i)
    return page


def test_pages_make_the_whole_session() -> None:
    whole = _whole()
    asked: List[int] = []

    def fetch(request: svc.GetSessionRequest) -> pb.SessionInfo:
        asked.append(request.layout_offset)
        return _page(whole, request.layout_offset, 2)

    assert read_session("s", fetch) == whole
    assert asked == [0, 2, 4]


def test_a_page_that_does_not_continue_is_refused() -> None:
    whole = _whole()
    with pytest.raises(InternalError, match="asked for the layout at 2, answered at 0"):
        read_session("s", lambda request: _page(whole, 0, 2))
    with pytest.raises(InternalError, match="the layout at 2 of 5 parameters answered none"):
        read_session("s", lambda r: _page(whole, r.layout_offset, 2 if r.layout_offset == 0 else 0))


def test_list_follows_tokens_and_refuses_one_that_does_not_move() -> None:
    tokens: List[str] = []

    def fetch(request: svc.ListSessionsRequest) -> svc.ListSessionsResponse:
        assert request.page_size == 2
        tokens.append(request.page_token)
        first = int(request.page_token) + 1 if request.page_token else 0
        page = svc.ListSessionsResponse(
            sessions=[pb.SessionSummary(session_id=str(i)) for i in range(first, min(5, first + 2))])
        if first + 2 < 5:
            page.next_page_token = str(first + 1)
        return page

    assert [s.session_id for s in list_all_sessions(fetch, 2)] == ["0", "1", "2", "3", "4"]
    assert tokens == ["", "1", "3"]
    with pytest.raises(InternalError, match="page token 'same' again"):
        list_all_sessions(lambda request: svc.ListSessionsResponse(next_page_token="same"))


def _spec(name: str) -> pb.SessionSpec:
    return pb.SessionSpec(name=name, num_trainers=1, gradient_mode=pb.GRADIENT_MODE_SHARDED,
                          parameters=[pb.ParameterSpec(name=f"w{i}", shape=[2]) for i in range(3)],
                          optimizer=config.chain(config.sgd(lr=0.5), clip_grad=0))


def test_the_client_lists_every_session_once_in_small_pages(client: optstep.Client) -> None:
    created = [client.create_session(_spec(f"paged-{i}")).info for i in range(5)]
    try:
        for info in created:
            assert [p.name for p in info.spec.parameters] == ["w0", "w1", "w2"]
            assert info.num_parameters == 3 and list(info.layout.owner) == [0, 0, 0]
        ids = {info.session_id for info in created}
        for page_size in (0, 1, 2, 1000, 5000):
            listed = [s.session_id for s in client.list_sessions(page_size)]
            assert len(listed) == len(set(listed)) and ids <= set(listed)
            assert listed == sorted(listed)
        summary = next(s for s in client.list_sessions(2) if s.session_id == created[0].session_id)
        assert (summary.name, summary.num_parameters, summary.world_size) == ("paged-0", 3, 1)
    finally:
        for info in created:
            client.close_session(info.session_id)
