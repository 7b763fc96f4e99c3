"""Steps through the server equal torch.optim's on the same model and data."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import optstep
from optstep import config, pb
from optstep.torch import RemoteOptimizer
from support import (assert_params_close, decay_groups, make_data, make_mlp, server_has,
                     train)

STEPS = 20


def test_adamw_matches_torch(client: optstep.Client) -> None:
    model, x, y = make_mlp(0), *make_data(1)
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(
        config.adamw(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1), clip_grad=0))
    local = torch.optim.AdamW(decay_groups(reference, weight_decay=0.1), lr=1e-2,
                              betas=(0.9, 0.99), eps=1e-8)
    train(model, remote, x, y, STEPS)
    train(reference, local, x, y, STEPS)
    assert remote.last_step.step == STEPS
    assert_params_close(model, reference)


def test_sgd_nesterov_matches_torch(client: optstep.Client) -> None:
    model, x, y = make_mlp(2), *make_data(3)
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(
        config.sgd(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True), clip_grad=0))
    local = torch.optim.SGD(decay_groups(reference, weight_decay=0.01), lr=0.1, momentum=0.9,
                            nesterov=True)
    train(model, remote, x, y, STEPS)
    train(reference, local, x, y, STEPS)
    assert_params_close(model, reference)


def test_global_clipping_matches_clip_grad_norm(client: optstep.Client) -> None:
    """The server's global clipping is torch's clip_grad_norm_ (coefficient clip/(norm+1e-6))."""
    model, x, y = make_mlp(4), *make_data(5)
    x = x * 5  # gradient norm ~0.32 at first, falling below the threshold of 0.3
    reference = copy.deepcopy(model)
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.5),
                                                                         clip_grad=0.3))
    local = torch.optim.SGD(reference.parameters(), lr=0.5)
    clipped = []
    for _ in range(STEPS):
        train(model, remote, x, y, 1)
        clipped.append(remote.last_step.clipped)
    train(reference, local, x, y, STEPS,
          before_step=lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3))
    assert clipped[0] and not all(clipped)  # both sides of the threshold are exercised
    assert_params_close(model, reference)


def test_bf16_gradients_and_parameters(client: optstep.Client) -> None:
    """bf16 on the wire both ways: the server up-casts bf16 gradients exactly, and the returned
    bf16 parameters are its fp32 masters rounded to nearest even."""
    model, x, y = make_mlp(6), *make_data(7)
    masters = {n: p.detach().clone() for n, p in model.named_parameters()}
    remote = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.1),
                                                                  clip_grad=0),
                             grad_dtype="bf16", return_dtype="bf16")
    for _ in range(3):
        remote.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for name, p in model.named_parameters():
            masters[name] -= 0.1 * p.grad.to(torch.bfloat16).float()
        remote.step()
        for name, p in model.named_parameters():
            assert torch.equal(p, masters[name].to(torch.bfloat16).float()), name
    pulled = client.pull_parameters(remote.session_id, "fp32").params
    for pid, name in enumerate(remote.parameter_names):
        np.testing.assert_allclose(pulled[pid], masters[name].numpy(), rtol=1e-6, atol=1e-7)


# ---- Muon: kind "muon" through the chain, against torch.optim.Muon where torch has it.

def _numpy_muon(p: np.ndarray, grads: list, lr: float, momentum: float, wd: float) -> np.ndarray:
    """Our float64 model of spec §3.4 with Nesterov, "simple" coefficients, shape_scaling."""
    a, b, c = 3.4445, -4.7750, 2.0315
    buf = np.zeros_like(p)
    for g in grads:
        p = p - lr * wd * p
        buf = momentum * buf + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * buf
        tall = u.shape[0] > u.shape[1]
        x = u.T if tall else u
        x = x / max(np.linalg.norm(x), 1e-7)
        for _ in range(5):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        o = x.T if tall else x
        p = p - lr * np.sqrt(max(1.0, p.shape[0] / p.shape[1])) * o
    return p


def _muon_config(precision: str) -> pb.OptimizerConfig:
    return config.chain(config.muon(
        lr=0.02, momentum=0.9, nesterov=True, weight_decay=0.1, coefficient_type="simple",
        num_ns_steps=5, scale_mode="shape_scaling", extra_scale_factor=1.0,
        fp32_matmul_prec=precision), clip_grad=0)


@pytest.fixture
def muon_available(client: optstep.Client) -> None:
    if not server_has(client, "muon"):
        pytest.skip("the server answers UNIMPLEMENTED for kind 'muon'")


@pytest.mark.usefixtures("muon_available")
def test_muon_options_reach_the_server(client: optstep.Client) -> None:
    """5 steps of fixed gradients (tall, wide) vs a float64 model, fp32 matmuls ("highest")."""
    rng = np.random.default_rng(8)
    shapes = {"tall": (12, 5), "wide": (5, 12)}
    spec = pb.SessionSpec(num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name=n, shape=s)
                                      for n, s in shapes.items()],
                          optimizer=_muon_config("highest"))
    info, _ = client.create_session(spec)
    start = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    grads = {n: [rng.standard_normal(s).astype(np.float32) for _ in range(5)]
             for n, s in shapes.items()}
    client.init_parameters(info.session_id, start)
    for k in range(5):
        reply = client.step(info.session_id, k + 1, {n: grads[n][k] for n in shapes})
    for pid, name in enumerate(shapes):
        expected = _numpy_muon(start[name].astype(np.float64), grads[name], 0.02, 0.9, 0.1)
        np.testing.assert_allclose(reply.params[pid], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="this torch has no optim.Muon")
@pytest.mark.usefixtures("muon_available")
def test_muon_matches_torch_muon(client: optstep.Client) -> None:
    """torch.optim.Muon (Nesterov, simple coefficients, "original" lr adjustment) against the
    server's Muon with the same coefficients. Documented difference: torch runs Newton–Schulz
    on bf16 tensors and normalizes after the cast, the server ("medium") normalizes in fp32
    and rounds each GEMM result to bf16; so the runs agree to bf16 accuracy, not to 1e-6."""
    model, x, y = make_mlp(9, bias=False), *make_data(10)
    reference = copy.deepcopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    remote = RemoteOptimizer(model, client, optimizer=_muon_config("medium"))
    local = torch.optim.Muon(reference.parameters(), lr=0.02, weight_decay=0.1, momentum=0.9,
                             nesterov=True, ns_coefficients=(3.4445, -4.7750, 2.0315),
                             ns_steps=5, adjust_lr_fn="original")
    train(model, remote, x, y, STEPS)
    train(reference, local, x, y, STEPS)
    for p0, p, q in zip(start, model.parameters(), reference.parameters()):
        moved, moved_ref = (p - p0).detach(), (q - p0).detach()
        error = (moved - moved_ref).norm() / moved_ref.norm()
        assert error < 2e-2, f"relative difference of the updates {error:.3g}"
