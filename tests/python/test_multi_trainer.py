"""Two trainer processes share one session, in SHARDED and REPLICATED mode."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

import optstep
from support import loss_of, make_mlp
from trainer_worker import MODEL_SEED, NUM_TRAINERS, STEPS, trainer_batch

WORKER = pathlib.Path(__file__).with_name("trainer_worker.py")


def _reference(mode: str) -> dict:
    """The same run in this process: the server's average, in trainer order, as torch grads."""
    model = make_mlp(MODEL_SEED)
    matrices = [p for p in model.parameters() if p.ndim > 1]
    vectors = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                             {"params": vectors, "weight_decay": 0.0}], lr=1e-2)
    trainers = 1 if mode == "sharded" else NUM_TRAINERS
    for _ in range(STEPS):
        total = None
        for t in range(trainers):
            model.zero_grad()
            loss_of(model, *trainer_batch(t, mode)).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        for p, g in zip(model.parameters(), total):
            p.grad = g * torch.tensor(1.0 / trainers, dtype=torch.float32)
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_two_trainer_processes(server: optstep.LocalServer, tmp_path: pathlib.Path,
                               mode: str) -> None:
    session = f"two-trainers-{mode}-{uuid.uuid4().hex[:8]}"
    outs = [tmp_path / f"trainer{t}.npz" for t in range(NUM_TRAINERS)]
    workers = [subprocess.Popen([sys.executable, str(WORKER), "--server", server.address,
                                 "--session", session, "--trainer", str(t), "--mode", mode,
                                 "--out", str(outs[t])],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for t in range(NUM_TRAINERS)]
    for t, worker in enumerate(workers):
        output, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, f"trainer {t}:\n{output}"

    expected = _reference(mode)
    results = [dict(np.load(out)) for out in outs]
    for name, value in expected.items():
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)
        scale = np.abs(value).max()
        np.testing.assert_allclose(results[0][name], value, rtol=1e-6, atol=1e-6 * scale,
                                   err_msg=name)


def test_attach_takes_the_session_parameters(client: optstep.Client) -> None:
    """A trainer that attaches to a session that has run (a restart) continues from it."""
    from optstep import config
    from optstep.torch import RemoteOptimizer
    from support import make_data, train

    name = f"resume-{uuid.uuid4().hex[:8]}"
    model, x, y = make_mlp(50), *make_data(51)
    first = RemoteOptimizer(model, client, optimizer=config.chain(config.sgd(lr=0.1)),
                            session_name=name)
    train(model, first, x, y, 3)
    restarted = make_mlp(52)
    second = RemoteOptimizer(restarted, client, optimizer=config.chain(config.sgd(lr=0.1)),
                             session_name=name)
    assert second.attached and second.session_id == first.session_id
    assert second.next_step == 4
    for a, b in zip(model.parameters(), restarted.parameters()):
        assert torch.equal(a, b)
