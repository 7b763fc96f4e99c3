"""client/python/examples/torchrun_replicated.py under torchrun (two workers, gloo): optstep's
REPLICATED session in place of DDP matches torch's AdamW over 20 steps, resumes from the torch
checkpoint bit for bit, and a LocalServer started inside a worker (where torchrun sets
WORLD_SIZE=2) serves.

The reference is computed here, in one process: DDP averages the workers' gradients of their
halves of the batch, which is the gradient of the mean of the two halves' losses: the same bits
as the example's --ddp run under torchrun, which a third launch of two workers would test at
twice the test's time."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Dict, List

import torch

import optstep
from torch import nn

from examples_support import EXAMPLES, load_example

example = load_example("torchrun_replicated")

STEPS = 20


def _ddp_reference() -> Dict:
    """What two DDP workers with torch's AdamW compute: rank 0's losses, the final model."""
    model = example.make_model()
    optimizer = example.local_adamw(model)
    losses = []
    for step in range(STEPS):
        halves = [example.batch(step, rank, 2) for rank in range(2)]
        optimizer.zero_grad()
        per_rank = [nn.functional.cross_entropy(model(x), y) for x, y in halves]
        ((per_rank[0] + per_rank[1]) / 2).backward()
        optimizer.step()
        losses.append(per_rank[0].item())
    return {"model": model.state_dict(), "losses": losses}


def _torchrun(*args: str, server_binary: str) -> None:
    env = dict(os.environ, OPTSTEP_SERVER=server_binary, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(EXAMPLES / "torchrun_replicated.py"),
                           f"--steps={STEPS}", *args], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _result(path: pathlib.Path) -> Dict:
    return torch.load(path, weights_only=False)


def _assert_close(a: Dict, b: Dict, tolerance: float = 1e-5) -> None:
    losses: List[float] = a["losses"]
    assert len(losses) == len(b["losses"]) == STEPS
    for step, (x, y) in enumerate(zip(losses, b["losses"]), 1):
        assert abs(x - y) <= tolerance, f"step {step}: loss {x} vs {y}"
    for name, value in a["model"].items():
        torch.testing.assert_close(value, b["model"][name], rtol=tolerance, atol=tolerance)


def test_replicated_matches_ddp_and_resumes_bit_for_bit(server: optstep.LocalServer,
                                                        server_binary: str,
                                                        tmp_path: pathlib.Path) -> None:
    checkpoint = tmp_path / "step10.pt"
    _torchrun(f"--server={server.address}", f"--checkpoint={checkpoint}", "--save-at=10",
              f"--out={tmp_path / 'remote.pt'}", server_binary=server_binary)
    remote = _result(tmp_path / "remote.pt")
    _assert_close(remote, _ddp_reference())

    # Resumed on a server the workers start themselves (LocalServer in rank 0).
    _torchrun(f"--resume={checkpoint}", f"--out={tmp_path / 'resumed.pt'}",
              server_binary=server_binary)
    resumed = _result(tmp_path / "resumed.pt")
    assert resumed["losses"] == remote["losses"][10:]
    for name, value in remote["model"].items():
        assert torch.equal(resumed["model"][name], value), name
