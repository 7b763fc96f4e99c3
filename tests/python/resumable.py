"""A training loop that resumes by itself, as docs/python.md shows it: each step's batch is a
function of the step number, so a RewindRequired rewinds the data with one assignment."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

import optstep
from optstep.torch import RemoteOptimizer
from support import loss_of, make_data


def batch(step: int, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The data of step `step` (the same in every run)."""
    return make_data(10_000 * seed + step, n=32)


def train_steps(model: nn.Module, opt: RemoteOptimizer, last: int, seed: int = 0,
                after_step: Optional[Callable[[int], None]] = None) -> List[int]:
    """Steps from ``opt.next_step`` to `last`; answers the steps it was told to rewind to."""
    rewinds = []
    step = opt.next_step
    while step <= last:
        x, y = batch(step, seed)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        try:
            opt.step()
        except optstep.RewindRequired as rewind:
            rewinds.append(rewind.step)
            step = rewind.next_step
            continue
        if after_step is not None:
            after_step(step)
        step += 1
    return rewinds


def parameters_of(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_bit_identical(actual: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor],
                         what: str) -> None:
    assert actual.keys() == expected.keys(), f"{what}: keys differ"
    for key in expected:
        a, b = actual[key], expected[key]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: '{key}' differs in kind"
        assert torch.equal(a.view(-1).view(torch.uint8) if a.dtype.is_floating_point else a,
                           b.view(-1).view(torch.uint8) if b.dtype.is_floating_point else b), \
            f"{what}: '{key}' differs (first differing value at " \
            f"{int((a.reshape(-1) != b.reshape(-1)).nonzero()[0])})"


def state_of(opt: RemoteOptimizer) -> Dict[str, torch.Tensor]:
    """The session's state dict (an automatic checkpoint that holds the session is waited for
    by the server)."""
    state: Dict[str, torch.Tensor] = opt.state_dict()["state"]
    return state
