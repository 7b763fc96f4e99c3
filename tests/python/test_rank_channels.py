"""optstep.rank_channels.RankChannels: which address reaches each rank. A rank given by the
caller stays where it was given; a rank reached where the group advertises it follows the
advertised address once it is no longer stood in (the first address seen may have been its
stand-in's, or its own process may be back elsewhere). No server: channels connect lazily."""

from __future__ import annotations

from typing import List

import grpc

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
