"""RemoteOptimizer clips as torch optimizers do: not at all unless asked (clip_grad=), while the
Megatron presets keep Megatron's global clip of 1.0."""

from __future__ import annotations

import copy

import pytest
import torch

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import assert_params_close, make_data, make_mlp, train

STEPS = 5


def _large_gradients(seed: int):
    model, (x, y) = make_mlp(seed), make_data(seed + 1)
    return model, x, y


def _amplify(model: torch.nn.Module) -> None:
    """Gradients with a global norm far above 1 (about 5 to 7)."""
    for p in model.parameters():
        p.grad.mul_(10)


def _amplify_and_clip(model: torch.nn.Module) -> None:
    _amplify(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def test_a_chain_without_clip_grad_does_not_clip(client: optstep.Client) -> None:
    model, x, y = _large_gradients(10)
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.01)))
    local = torch.optim.SGD(reference.parameters(), lr=0.01)
    clipped, norms = [], []
    for _ in range(STEPS):
        train(model, remote, x, y, 1, before_step=_amplify)
        clipped.append(remote.last_step.clipped)
        norms.append(remote.last_step.grad_norm)
    train(reference, local, x, y, STEPS, before_step=_amplify)
    assert min(norms) > 1.0 and not any(clipped), (norms, clipped)
    assert_params_close(model, reference)


def test_clip_grad_is_torchs_clip_grad_norm(client: optstep.Client) -> None:
    model, x, y = _large_gradients(12)
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.01)),
                             clip_grad=1.0)
    local = torch.optim.SGD(reference.parameters(), lr=0.01)
    train(model, remote, x, y, STEPS, before_step=_amplify)
    train(reference, local, x, y, STEPS, before_step=_amplify_and_clip)
    assert remote.last_step.clipped
    assert_params_close(model, reference)


def test_a_preset_keeps_megatrons_clip_of_one(client: optstep.Client) -> None:
    model, x, y = _large_gradients(14)
    remote = RemoteOptimizer(model, client, optimizer="sgd")
    train(model, remote, x, y, 1, before_step=_amplify)
    assert remote.last_step.grad_norm > 1.0 and remote.last_step.clipped
    other = copy.deepcopy(model)
    unclipped = RemoteOptimizer(other, client, optimizer="sgd", clip_grad=0)
    train(other, unclipped, x, y, 1, before_step=_amplify)
    assert not unclipped.last_step.clipped


def test_a_chains_own_clip_grad_and_a_different_argument_are_refused(
        client: optstep.Client) -> None:
    with pytest.raises(ValueError, match="disagree"):
        RemoteOptimizer(make_mlp(0), client, optimizer=config.chain(config.sgd(lr=0.1),
                                                                     clip_grad=0.5),
                        clip_grad=1.0)
