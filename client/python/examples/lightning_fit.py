"""A Lightning module whose optimizer steps run on an optstep server.

    lightning_fit.py [--server HOST:PORT] [--local] [--steps 20] [--save build/fit.ckpt]
                     [--resume CHECKPOINT.ckpt]

A small MLP classifies synthetic data (fixed seed, 10 batches an epoch; the batch of a step is
chosen by the global step, so a resumed fit sees the same data as an uninterrupted one whatever
batch index Lightning's loop resumes at). configure_optimizers
answers a RemoteOptimizer with optstep's AdamW, or with --local torch's AdamW in the same groups
(decay for matrices, none for 1-D parameters and biases, as optstep routes them), with a linear
warm-up schedule either way. Lightning's gradient_clip_val clips before step(); the optstep session
clips nothing more (torch semantics, docs/python.md). --save writes Lightning's checkpoint when
the fit ends (its optimizer state is RemoteOptimizer.state_dict(), the session's state from the
server); --resume continues from one bit for bit. Without --server a local CPU server is
started.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Sequence

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer

from example_client import add_arguments, connect

LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.999), 1e-8, 0.01
BATCHES, BATCH = 10, 16


class Classifier(L.LightningModule):
    """An MLP (8 → 32 → 32 → 4) with cross-entropy; the optimizer through optstep or local."""

    def __init__(self, client: Optional[optstep.Client]) -> None:
        super().__init__()
        self.client = client
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(BATCHES, BATCH, 8, generator=generator)
        self.y = (self.x[..., :4].argmax(dim=-1) + (self.x[..., 4] > 0).long()) % 4
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 4))
        self.losses: List[float] = []

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        x, y = self.x[self.global_step % BATCHES], self.y[self.global_step % BATCHES]
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Dict[str, Any]:
        optimizer: torch.optim.Optimizer
        if self.client is None:
            decay = [p for n, p in self.named_parameters() if p.ndim > 1]
            rest = [p for n, p in self.named_parameters() if p.ndim <= 1]
            optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                           {"params": rest, "weight_decay": 0.0}],
                                          lr=LR, betas=BETAS, eps=EPS)
        else:
            optimizer = RemoteOptimizer(self, self.client, optimizer=config.chain(
                config.adamw(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)))
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def data() -> DataLoader:  # type: ignore[type-arg]
    """An epoch of BATCHES steps (the module picks each step's batch)."""
    return DataLoader(TensorDataset(torch.arange(BATCHES)), batch_size=1)


def fit(steps: int, client: Optional[optstep.Client], *, save: Optional[str] = None,
        resume: Optional[str] = None, seed: int = 0) -> Classifier:
    """Fits for `steps` steps (to `steps` in all when resuming), then writes the checkpoint
    `save`; answers the module (``losses``: those of the steps run). `client` None: torch's
    AdamW."""
    L.seed_everything(seed, verbose=False)
    module = Classifier(client)
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, gradient_clip_val=1.0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0)
    trainer.fit(module, train_dataloaders=data(), ckpt_path=resume)
    if save:
        trainer.save_checkpoint(save)
    return module


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--save", help="write a checkpoint (.ckpt) when the fit ends")
    parser.add_argument("--resume", help="a checkpoint (.ckpt) of an earlier run")
    options = parser.parse_args(argv)
    with connect(options) as client:
        module = fit(options.steps, client, save=options.save, resume=options.resume)
    print(f"fitted {options.steps} steps; last loss {module.losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
