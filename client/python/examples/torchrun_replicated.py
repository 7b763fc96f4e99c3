"""Data-parallel training under torchrun with optstep in place of DistributedDataParallel.

    torchrun --nproc_per_node=2 torchrun_replicated.py [--server HOST:PORT] [--ddp]
        [--steps 20] [--save-at 10 --checkpoint ckpt.pt] [--resume ckpt.pt] [--out result.pt]

Every worker computes the gradients of its own share of each batch and sends them whole to one
optstep session (gradient_mode "replicated", num_trainers = the world size): the server averages
them in trainer order, as DDP's all-reduce does, applies AdamW once, and each worker gets the
updated parameters back; no all-reduce runs between the workers. With --ddp the workers use
DistributedDataParallel and torch's AdamW (gloo) instead, in the same groups.

The checkpoint is the usual torch one: rank 0 saves ``{"model": ..., "optimizer":
optimizer.state_dict(), "step": ...}`` with torch.save (the optimizer's state is the session's,
from the server), and --resume loads it on every worker and continues bit for bit. Without
--server rank 0 starts a local CPU server (optstep.LocalServer; torchrun's WORLD_SIZE is the
trainers', not the server's) and tells the others its address. Rank 0 writes the final
parameters and its losses to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from typing import Any, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer

LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
BATCHES, BATCH = 10, 32


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def batch(step: int, rank: int, world: int) -> Any:
    """This worker's share of the batch of `step` (the same data whatever the world size)."""
    generator = torch.Generator().manual_seed(1000 + step % BATCHES)
    x = torch.randn(BATCH, 8, generator=generator)
    y = (x[:, :4].argmax(dim=1) + (x[:, 4] > 0).long()) % 4
    share = BATCH // world
    return x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]


def local_adamw(model: nn.Module) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)


@contextlib.contextmanager
def server_address(server: Optional[str]) -> Iterator[str]:
    """--server, else a LocalServer of rank 0, whose address every rank learns."""
    if server:
        yield server
        return
    with contextlib.ExitStack() as stack:
        shared: List[Optional[str]] = [None]
        if dist.get_rank() == 0:
            shared[0] = stack.enter_context(optstep.LocalServer()).address
        dist.broadcast_object_list(shared, src=0)
        assert shared[0] is not None
        yield shared[0]
        dist.barrier()  # every worker is done before rank 0 stops the server


def train(options: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    with contextlib.ExitStack() as stack:
        module: nn.Module
        optimizer: torch.optim.Optimizer
        if options.ddp:
            module, optimizer = nn.parallel.DistributedDataParallel(model), local_adamw(model)
        else:
            address = stack.enter_context(server_address(options.server))
            client = stack.enter_context(optstep.Client(address))
            name: List[Optional[str]] = [f"torchrun-{uuid.uuid4().hex[:12]}"]
            dist.broadcast_object_list(name, src=0)  # one session for the whole job
            module = model
            optimizer = RemoteOptimizer(model, client, session_name=name[0], trainer_id=rank,
                                        num_trainers=world, gradient_mode="replicated",
                                        optimizer=config.chain(config.adamw(
                                            lr=LR, betas=BETAS, eps=EPS,
                                            weight_decay=WEIGHT_DECAY)))
        dist.barrier()  # every worker has joined the session (and set its initial values)
        start = 0
        if options.resume:
            saved = torch.load(options.resume, weights_only=False)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            start = saved["step"]
            dist.barrier()  # every worker has loaded before any steps
        losses = []
        for step in range(start, options.steps):
            x, y = batch(step, rank, world)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(module(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if options.checkpoint and step + 1 == options.save_at:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": step + 1}, options.checkpoint)
                dist.barrier()
        if rank == 0 and options.out:
            torch.save({"model": model.state_dict(), "losses": losses}, options.out)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", help="optstep server (default: rank 0 starts a local one)")
    # (not --local: torchrun would take it for an abbreviation of its own --local-addr)
    parser.add_argument("--ddp", action="store_true", help="DDP and torch's AdamW instead")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-at", type=int, default=10, help="the step --checkpoint is saved")
    parser.add_argument("--checkpoint", help="where rank 0 saves the checkpoint")
    parser.add_argument("--resume", help="a checkpoint to continue from")
    parser.add_argument("--out", help="where rank 0 writes the final parameters and losses")
    options = parser.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        train(options)
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"trained {options.steps} steps on {os.environ.get('WORLD_SIZE')} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
