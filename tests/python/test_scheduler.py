"""torch.optim.lr_scheduler drives the server's per-step lr through the param groups."""

from __future__ import annotations

import copy

import torch

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import assert_params_close, decay_groups, make_data, make_mlp, train


def test_scheduled_lr_matches_torch(client: optstep.Client) -> None:
    model, x, y = make_mlp(20), *make_data(21)
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(
        config.adamw(lr=3e-2, weight_decay=0.05), clip_grad=0))
    local = torch.optim.AdamW(decay_groups(reference, weight_decay=0.05), lr=3e-2)
    schedules = [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-2, total_steps=20,
                                                     cycle_momentum=False)
                 for opt in (remote, local)]
    train(model, remote, x, y, 20, schedules[0])
    train(reference, local, x, y, 20, schedules[1])
    assert_params_close(model, reference)


def test_lr_zero_freezes_the_step(client: optstep.Client) -> None:
    """A schedule that sets lr (and weight decay) to 0 for one step leaves the parameters
    exactly unchanged, though the gradients are not zero."""
    model, x, y = make_mlp(22), *make_data(23)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.1)))
    lambdas = torch.optim.lr_scheduler.LambdaLR(remote, lambda epoch: 0.0 if epoch == 1 else 1.0)
    snapshots = []
    for _ in range(4):
        snapshots.append([p.detach().clone() for p in model.parameters()])
        train(model, remote, x, y, 1, lambdas)
    changed = [any(not torch.equal(a, b) for a, b in zip(before, after))
               for before, after in zip(snapshots, snapshots[1:])]
    assert changed == [True, False, True]


def test_per_group_lr(client: optstep.Client) -> None:
    """Groups keep their own lr: only the matrices move when the biases' lr is 0."""
    model, x, y = make_mlp(24), *make_data(25)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.1)))
    for group in remote.param_groups:
        if group["wd_mult"] == 0.0:  # the 1-D group
            group["lr"] = 0.0
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, remote, x, y, 1)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) == name.endswith(".bias"), name
