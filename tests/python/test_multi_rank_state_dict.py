"""state_dict() / load_state_dict() across ranks: a state dict exported from two ranks (each
parameter's optimizer state gathered from its owner) equals the one-rank export, and loaded into
a group of three ranks it continues the run bit for bit."""

from __future__ import annotations

import copy
from typing import Iterator

import pytest
import torch

import optstep
from optstep import config, pb
from optstep.torch import RemoteOptimizer
from support import make_data, make_mlp, train


@pytest.fixture(scope="module")
def groups(server_binary: str) -> Iterator[tuple]:
    with optstep.LocalGroup(2, server_binary) as two, optstep.LocalGroup(3, server_binary) as three:
        yield two, three


def _optimizer() -> pb.OptimizerConfig:
    return config.chain(config.adamw(lr=1e-2, weight_decay=0.1), clip_grad=1.0)


def test_state_dict_moves_from_two_ranks_to_three(groups: tuple, client: optstep.Client) -> None:
    two, three = groups
    x, y = make_data(71)
    on_one, on_two = make_mlp(70), make_mlp(70)
    one_opt = RemoteOptimizer(on_one, client, optimizer=_optimizer())
    with optstep.Client(rank_targets=two.targets) as c2, \
            optstep.Client(rank_targets=three.targets) as c3:
        two_opt = RemoteOptimizer(on_two, c2, optimizer=_optimizer())
        assert {p.owner for p in c2.layout(two_opt.session_id).params} == {0, 1}
        train(on_one, one_opt, x, y, 4)
        train(on_two, two_opt, x, y, 4)
        saved_one, saved_two = one_opt.state_dict(), two_opt.state_dict()
        assert set(saved_two["state"]) == set(saved_one["state"])
        for key, value in saved_one["state"].items():
            assert torch.equal(saved_two["state"][key], value), key

        at_save = copy.deepcopy(on_two)
        on_three = make_mlp(99)
        three_opt = RemoteOptimizer(on_three, c3, optimizer=_optimizer())
        assert {p.owner for p in c3.layout(three_opt.session_id).params} == {0, 1, 2}
        three_opt.load_state_dict(saved_two)
        for a, b in zip(on_three.parameters(), at_save.parameters()):
            assert torch.equal(a, b)
        train(on_two, two_opt, x, y, 3)
        train(on_three, three_opt, x, y, 3)
        for (name, a), b in zip(on_two.named_parameters(), on_three.parameters()):
            assert torch.equal(a, b), name


def test_a_parameter_named_like_a_group_counter_keeps_the_counter_on_every_rank(
        groups: tuple) -> None:
    """"state/<sub>/group0/step" is group 0's step counter, which every rank advances, also when a
    parameter is named "group0": a state dict loaded back (a rollback) sets it on every rank, not
    only on that parameter's owner, and the run continues bit for bit as one never rolled back."""
    two, _ = groups
    x, y = make_data(81)
    with optstep.Client(rank_targets=two.targets) as c2:
        probe = RemoteOptimizer(make_mlp(80), c2, optimizer=_optimizer())
        owners = [p.owner for p in c2.layout(probe.session_id).params]
        probe.close_session()
        renamed = owners.index(1)  # a parameter of rank 1; rank 0 owns others of group 0
        assert 0 in owners

        def named(model: torch.nn.Module) -> list:
            return [("group0" if i == renamed else name, p)
                    for i, (name, p) in enumerate(model.named_parameters())]

        rolled, straight = make_mlp(80), make_mlp(80)
        rolled_opt = RemoteOptimizer(named(rolled), c2, optimizer=_optimizer())
        straight_opt = RemoteOptimizer(named(straight), c2, optimizer=_optimizer())
        assert [p.owner for p in c2.layout(rolled_opt.session_id).params] == owners
        train(rolled, rolled_opt, x, y, 1)
        saved = rolled_opt.state_dict()
        assert "state/adamw/group0/step" in saved["state"], sorted(saved["state"])
        train(rolled, rolled_opt, x, y, 2)
        rolled_opt.load_state_dict(saved)
        assert rolled_opt.next_step == 2
        train(rolled, rolled_opt, x, y, 2)
        train(straight, straight_opt, x, y, 3)
        for (name, a), b in zip(rolled.named_parameters(), straight.parameters()):
            assert torch.equal(a, b), name
        rolled_opt.close_session()
        straight_opt.close_session()
