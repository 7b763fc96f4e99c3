"""RemoteOptimizer keeps the model and its step counter to the session's: a rollback before a
trainer's first step of its own, a state dict load whose pull fails, and a close while a
backward's step is open. On the native data path and the pure-Python one."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import loss_of, make_data, make_mlp


def _optimizer() -> Any:
    return config.chain(config.adamw(lr=1e-2, weight_decay=0.1))


def _step(model: nn.Module, opt: RemoteOptimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    opt.synchronize()


def _holds(model: nn.Module, params: Dict[int, Any]) -> bool:
    """Whether the model's parameters are `params` (by index), bit for bit."""
    return all(torch.equal(p.detach(), torch.from_numpy(params[i]).reshape(p.shape))
               for i, p in enumerate(model.parameters()))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_rollback_before_an_attached_trainers_first_step_is_a_rewind(
        server: optstep.LocalServer, path: str, overlap: bool) -> None:
    """A trainer (a process restarted, a new client) attaches to its session at step 4, and the
    session is rolled back to step 2 before the trainer's first step. Before, its steps were
    refused out of sequence for ever (FailedPreconditionError): its client had seen no step
    applied, so it could not tell the rollback from a mistake of its own."""
    x, y = make_data(61)
    model = make_mlp(62)
    name = f"attach-{path}-{overlap}"
    with optstep.Client(server.address) as first:
        opt = RemoteOptimizer(model, first, optimizer=_optimizer(), session_name=name)
        for _ in range(2):
            _step(model, opt, x, y)
        saved = first.export_state_dict(opt.session_id)
        after_two = {i: v.copy() for i, v in first.pull_parameters(opt.session_id).params.items()}
        for _ in range(2):
            _step(model, opt, x, y)
    rewound: List[int] = []
    with optstep.Client(server.address) as restarted:
        attached = copy.deepcopy(model)
        again = RemoteOptimizer(attached, restarted, optimizer=_optimizer(), session_name=name,
                                overlap=overlap, on_rewind=rewound.append)
        assert again.attached and again.next_step == 5
        with optstep.Client(server.address) as restorer:
            restorer.import_state_dict(again.session_id, saved)
        with pytest.raises(optstep.RewindRequired) as raised:
            _step(attached, again, x, y)
        assert raised.value.step == 2 and rewound == [2] and again.next_step == 3
        assert _holds(attached, after_two), "the model did not take the restored parameters"
        # The rewound step is what a native client connected later is told (a stale step 4 made
        # a refusal of steps 3 and 4 read as a rollback).
        assert restarted._native._marks[(again.session_id, 0)] == 2
        _step(attached, again, x, y)  # the loop redoes step 3
        assert again.last_step is not None and again.last_step.step == 3
        again.close_session()
        assert not restarted._native._marks, "a closed session's steps are kept"


def test_a_load_whose_pull_fails_makes_the_next_step_pull_and_rewind(
        client: optstep.Client, path: str) -> None:
    """load_state_dict imports the state, then pulls its parameters into the model; that pull
    fails. Before, the step counter had moved to the loaded step and the model kept the
    parameters of before the load: the next step sent their gradients as the loaded step's,
    and it was applied. Now that step pulls the loaded parameters and raises the rewind to the
    loaded step, and the one after it is applied."""
    x, y = make_data(71)
    model = make_mlp(72)
    rewound: List[int] = []
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), on_rewind=rewound.append)
    for _ in range(2):
        _step(model, opt, x, y)
    saved = opt.state_dict()
    after_two = {i: v.copy() for i, v in client.pull_parameters(opt.session_id).params.items()}
    for _ in range(2):
        _step(model, opt, x, y)
    pull = client.pull_parameters

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise optstep.UnavailableError("rank 0 is not reachable")

    setattr(client, "pull_parameters", unreachable)
    with pytest.raises(optstep.UnavailableError):
        opt.load_state_dict(saved)
    setattr(client, "pull_parameters", pull)
    with pytest.raises(optstep.RewindRequired) as raised:
        _step(model, opt, x, y)
    assert raised.value.step == 2 and rewound == [2] and opt.next_step == 3
    assert _holds(model, after_two), "the model did not take the loaded parameters"
    _step(model, opt, x, y)
    assert opt.last_step is not None and opt.last_step.step == 3
    opt.close_session()


def test_closing_a_session_closes_the_step_a_backward_opened(client: optstep.Client,
                                                             path: str) -> None:
    """overlap=True: a backward that did not reach step() (the loop raised before it) leaves its
    step open; close_session() closes it. Before, it stayed open, and on the native data path
    held the C++ client, which Client.close() then could not free."""
    x, y = make_data(81)
    model = make_mlp(82)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True, bucket_bytes=512)
    _step(model, opt, x, y)
    opt.zero_grad()
    loss_of(model, x, y).backward()  # its buckets leave; no step()
    overlap = opt._overlap
    assert overlap is not None and overlap._step is not None
    opt.close_session()
    assert overlap._step is None, "the step the backward opened is still open"
    if path == "native":
        natives = client._native._clients
        assert natives and all(n._users == 0 for n in natives), "the C++ client is still held"
