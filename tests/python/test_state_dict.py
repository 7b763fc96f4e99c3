"""state_dict() / load_state_dict() through the server's ExportStateDict / ImportStateDict."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import make_data, make_mlp, train


def _export_or_skip(opt: RemoteOptimizer) -> dict:
    try:
        return opt.state_dict()
    except optstep.UnimplementedError as e:
        pytest.skip(f"the server answers UNIMPLEMENTED for ExportStateDict ({e.message})")


def test_state_dict_round_trip_continues_bit_for_bit(client: optstep.Client) -> None:
    """Save after 5 steps, restore into a fresh session (other initial weights), run 5 more
    steps on both: the continuation equals the uninterrupted run bit for bit (spec §9.6)."""
    model, x, y = make_mlp(30), *make_data(31)
    optimizer = config.chain(config.adamw(lr=1e-2, weight_decay=0.1), clip_grad=0)
    first = RemoteOptimizer(model, client, optimizer=optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(first, step_size=3, gamma=0.5)
    train(model, first, x, y, 5, scheduler)
    saved = _export_or_skip(first)
    at_save = copy.deepcopy(model)

    keys = set(saved["state"])
    for name in first.parameter_names:
        assert f"param/{name}" in keys
        assert any(k.startswith("state/") and k.endswith(f"/{name}/exp_avg") for k in keys), keys
    buffer = io.BytesIO()
    torch.save(saved, buffer)  # a state dict survives torch's own serialization
    buffer.seek(0)
    restored_dict = torch.load(buffer)

    other = make_mlp(99)
    second = RemoteOptimizer(other, client, optimizer=optimizer)
    second.load_state_dict(restored_dict)
    for a, b in zip(other.parameters(), at_save.parameters()):
        assert torch.equal(a, b)
    assert [g["lr"] for g in second.param_groups] == [g["lr"] for g in first.param_groups]

    train(model, first, x, y, 5)
    train(other, second, x, y, 5)
    for (name, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), name


def test_load_refuses_another_chain(client: optstep.Client) -> None:
    model = make_mlp(32)
    sgd = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.1)))
    adam = RemoteOptimizer(copy.deepcopy(model), client,
                           optimizer=config.chain(config.adamw(lr=0.1)))
    saved = {"state": {}, "param_groups": [dict(g, params=[]) for g in sgd.param_groups],
             "step": 0}
    with pytest.raises(ValueError, match="sub_optimizer"):
        adam.load_state_dict(saved)


def test_state_dict_before_the_first_step_asks_nothing_of_the_server(
        client: optstep.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate saves and loads the optimizer once before training: neither goes through the
    server while nothing has been stepped, and training continues as without them."""
    model, x, y = make_mlp(33), *make_data(34)
    reference = copy.deepcopy(model)
    optimizer = config.chain(config.adamw(lr=1e-2, weight_decay=0.1))
    opt = RemoteOptimizer(model, client, optimizer=optimizer)
    untouched = RemoteOptimizer(reference, client, optimizer=optimizer)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a state dict before the first step went through the server")

    with monkeypatch.context() as patch:
        patch.setattr(client, "export_state_dict", refused)
        patch.setattr(client, "import_state_dict", refused)
        saved = opt.state_dict()
        assert saved["state"] == {} and saved["step"] == 0
        opt.load_state_dict(saved)
    train(model, opt, x, y, 3)
    train(reference, untouched, x, y, 3)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="before its first step; session .* has applied 3"):
        opt.load_state_dict(saved)
