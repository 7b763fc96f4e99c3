"""Small models, data and comparisons shared by the Python tests."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import nn

import optstep
from optstep import config, pb


def make_mlp(seed: int, sizes: Tuple[int, ...] = (8, 16, 16, 4), bias: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1], bias=bias))
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def make_data(seed: int, n: int = 64, inputs: int = 8,
              classes: int = 4) -> Tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inputs, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return x, y


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def train(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          steps: int, scheduler: Optional[object] = None,
          before_step: Optional[Callable[[nn.Module], None]] = None) -> None:
    """`steps` full-batch steps; `before_step` may edit the gradients (e.g. clip them)."""
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if before_step is not None:
            before_step(model)
        opt.step()
        if scheduler is not None:
            scheduler.step()


def decay_groups(model: nn.Module, **hyper: float) -> list:
    """torch param groups that mirror the server's wd_mult rule: no decay for 1-D / biases."""
    matrices = [p for n, p in model.named_parameters() if p.ndim > 1 and not n.endswith(".bias")]
    others = [p for n, p in model.named_parameters() if p.ndim <= 1 or n.endswith(".bias")]
    weight_decay = hyper.pop("weight_decay", 0.0)
    return [{"params": matrices, "weight_decay": weight_decay, **hyper},
            {"params": others, "weight_decay": 0.0, **hyper}]


def assert_params_close(actual: nn.Module, expected: nn.Module, rtol: float = 1e-6) -> None:
    """Every parameter within `rtol` of the expected one, relative to its largest entry."""
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        scale = b.detach().abs().max().item()
        torch.testing.assert_close(a.detach(), b.detach(), rtol=rtol, atol=rtol * scale,
                                   msg=lambda m, name=name: f"param '{name}': {m}")


def server_has(client: optstep.Client, kind_or_preset: str, preset: bool = False) -> bool:
    """False when the server answers UNIMPLEMENTED for this optimizer kind (or preset)."""
    if preset:
        optimizer = config.preset(kind_or_preset)
    else:
        make = getattr(config, kind_or_preset)
        optimizer = config.chain(make(lr=0.01), config.adamw())
    spec = pb.SessionSpec(num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name="w", shape=[2, 2])],
                          optimizer=optimizer)
    try:
        info, _ = client.create_session(spec)
    except optstep.UnimplementedError:
        return False
    client.close_session(info.session_id)
    return True
