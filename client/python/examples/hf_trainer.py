"""A Hugging Face Trainer whose optimizer steps run on an optstep server.

    hf_trainer.py [--server HOST:PORT] [--local] [--steps 20] [--output build/hf_trainer]
                  [--save-steps 10] [--resume CHECKPOINT_DIR]

A tiny GPT-2 (built from a GPT2Config, no download) learns the bundled text below, a character
per token. The optimizer is AdamW through optstep (RemoteOptimizer), or with --local torch's
AdamW with the same groups (decay for matrices, none for 1-D parameters and biases, as optstep
routes them). The Trainer's own clipping (max_grad_norm 1.0) clips before step(); the optstep
session clips nothing more (torch semantics, docs/python.md). Checkpoints are the Trainer's:
optimizer.pt holds RemoteOptimizer.state_dict() (the session's state from the server), and
--resume continues from one bit for bit. Without --server a local CPU server is started.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer

from example_client import add_arguments, connect

TEXT = ("optstep runs the optimizer step of a training job as a service: trainers send their "
        "gradients, the server applies the update and returns the parameters. ") * 8
BLOCK = 32
LR, BETAS, EPS, WEIGHT_DECAY = 3e-3, (0.9, 0.999), 1e-8, 0.01


class Characters(Dataset):  # type: ignore[type-arg]
    """TEXT as blocks of BLOCK characters (token = character index in the alphabet)."""

    def __init__(self) -> None:
        self.alphabet = sorted(set(TEXT))
        ids = torch.tensor([self.alphabet.index(c) for c in TEXT])
        self.blocks = ids[:len(ids) // BLOCK * BLOCK].view(-1, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def make_model(vocab: int, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=BLOCK, n_embd=32, n_layer=1,
                                      n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0))


def local_adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    """torch's AdamW in optstep's groups: decay for matrices, none for 1-D parameters/biases."""
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and not n.endswith(".bias")]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1 or n.endswith(".bias")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)


def remote_adamw(model: torch.nn.Module, client: optstep.Client) -> RemoteOptimizer:
    return RemoteOptimizer(model, client, optimizer=config.chain(
        config.adamw(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)))


def train(output: pathlib.Path, steps: int, client: Optional[optstep.Client], *,
          save_steps: int = 0, resume: Optional[str] = None,
          seed: int = 0) -> Tuple[GPT2LMHeadModel, List[float]]:
    """Runs the Trainer for `steps` steps (to `steps` in all when resuming); answers the model
    and the loss of every step run. `client` None: torch's AdamW."""
    data = Characters()
    model = make_model(len(data.alphabet), seed)
    optimizer = local_adamw(model) if client is None else remote_adamw(model, client)
    args = TrainingArguments(
        output_dir=str(output), max_steps=steps, per_device_train_batch_size=4,
        learning_rate=LR, lr_scheduler_type="linear", warmup_steps=2, max_grad_norm=1.0,
        logging_steps=1, save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500, save_only_model=False, seed=seed, data_seed=seed,
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      optimizers=(optimizer, None))
    trainer.train(resume_from_checkpoint=resume)
    return model, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--resume", help="a checkpoint directory of an earlier run")
    parser.add_argument("--output", default="build/hf_trainer")
    options = parser.parse_args(argv)
    with connect(options) as client:
        model, losses = train(pathlib.Path(options.output), options.steps, client,
                      save_steps=options.save_steps, resume=options.resume)
    norm = torch.sqrt(sum((p.detach() ** 2).sum() for p in model.parameters()))
    print(f"trained {options.steps} steps; last loss {losses[-1]:.6f}, parameter norm "
          f"{norm.item():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
