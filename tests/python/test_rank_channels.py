"""optstep.rank_channels.RankChannels: which address reaches each rank. A rank given by the
caller stays where it was given; a rank reached where the group advertises it follows the
advertised address once it is no longer stood in (the first address seen may have been its
stand-in's, or its own process may be back elsewhere). A rank back from its stand-in gets a new
channel: the old one may sit out a reconnect backoff. Channels connect lazily; one case starts a
server on the rank's port."""

from __future__ import annotations

import socket
from concurrent import futures
from typing import List, Optional

import grpc
import pytest

from optstep.layout import SessionLayout
from optstep.rank_channels import RankChannels


def _layout(rank_targets: List[str], stood_in: List[int]) -> SessionLayout:
    return SessionLayout(session_id="s", world_size=len(rank_targets), params=(),
                         rank_targets=tuple(rank_targets), stood_in_ranks=tuple(stood_in))


def _targets(ranks: RankChannels, layout: SessionLayout) -> List[str]:
    return [rank.target for rank in ranks.reach(layout)]


def test_an_advertised_rank_first_seen_stood_in_is_reached_at_its_own_address_once_back() -> None:
    ranks = RankChannels(["rank0:1"], explicit=False, open_channel=grpc.insecure_channel)
    stood_in = _layout(["rank0:1", "stand-in:2"], [1])
    ranks.follow_stand_ins(stood_in)
    assert _targets(ranks, stood_in) == ["rank0:1", "stand-in:2"]
    back = _layout(["rank0:1", "rank1:3"], [])
    ranks.follow_stand_ins(back)
    assert _targets(ranks, back) == ["rank0:1", "rank1:3"]
    # Its process back at yet another address.
    elsewhere = _layout(["rank0:1", "rank1:4"], [])
    ranks.follow_stand_ins(elsewhere)
    assert _targets(ranks, elsewhere) == ["rank0:1", "rank1:4"]
    ranks.close()


def test_given_ranks_stay_where_they_were_given() -> None:
    ranks = RankChannels(["rank0:1", "rank1:3"], explicit=True,
                         open_channel=grpc.insecure_channel)
    stood_in = _layout(["rank0:1", "stand-in:2"], [1])
    ranks.follow_stand_ins(stood_in)
    assert _targets(ranks, stood_in) == ["rank0:1", "stand-in:2"]
    moved = _layout(["rank0:9", "rank1:4"], [])
    ranks.follow_stand_ins(moved)
    assert _targets(ranks, moved) == ["rank0:1", "rank1:3"]
    ranks.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _any_method() -> grpc.GenericRpcHandler:
    """Answers every call UNIMPLEMENTED: a call that ends so reached its server."""
    class Handler(grpc.GenericRpcHandler):
        def service(self, handler_call_details: grpc.HandlerCallDetails
                    ) -> Optional[grpc.RpcMethodHandler]:
            return None
    return Handler()


def test_a_rank_back_from_its_stand_in_is_called_without_waiting_out_a_reconnect_backoff() -> None:
    """Before, the rank's channel from when its process was away stayed in gRPC's reconnect
    backoff (here 30 s), and a call to the rank back failed UNAVAILABLE at once."""
    # As the client's channels: each its own subchannels (Client._channel_options).
    backoff = [("grpc.initial_reconnect_backoff_ms", 30000),
               ("grpc.min_reconnect_backoff_ms", 30000), ("grpc.max_reconnect_backoff_ms", 30000),
               ("grpc.use_local_subchannel_pool", 1)]
    port = _free_port()
    own = f"127.0.0.1:{port}"
    ranks = RankChannels(["rank0:1", own], explicit=True,
                         open_channel=lambda target: grpc.insecure_channel(target, backoff))
    call = ranks.reach(_layout(["rank0:1", own], []))[1].channel.unary_unary("/t.T/M")
    with pytest.raises(grpc.RpcError) as away:
        call(b"", timeout=5)
    assert away.value.code() == grpc.StatusCode.UNAVAILABLE  # nothing listens: in backoff now
    ranks.follow_stand_ins(_layout(["rank0:1", "stand-in:2"], [1]))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=[_any_method()])
    assert server.add_insecure_port(own) == port
    server.start()
    try:
        back = _layout(["rank0:1", own], [])
        ranks.follow_stand_ins(back)
        call = ranks.reach(back)[1].channel.unary_unary("/t.T/M")
        with pytest.raises(grpc.RpcError) as reached:
            call(b"", timeout=5)
        assert reached.value.code() == grpc.StatusCode.UNIMPLEMENTED, reached.value.details()
    finally:
        server.stop(None)
        ranks.close()
