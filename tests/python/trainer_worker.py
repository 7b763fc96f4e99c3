"""One trainer process of test_multi_trainer: trains the shared MLP through a named session and
writes its final parameters to an .npz file.

    trainer_worker.py --server HOST:PORT --session NAME --trainer T --mode sharded --out F.npz
"""

from __future__ import annotations

import argparse

import numpy as np

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import make_data, make_mlp, train

NUM_TRAINERS = 2
STEPS = 10
MODEL_SEED, DATA_SEED = 40, 41


def optimizer_config() -> optstep.pb.OptimizerConfig:
    return config.chain(config.adamw(lr=1e-2, weight_decay=0.1), clip_grad=0)


def trainer_batch(trainer: int, mode: str):
    """REPLICATED: trainer t holds half t of the batch; SHARDED: every trainer computes the
    full-batch (already averaged) gradient and sends its share of the elements."""
    x, y = make_data(DATA_SEED)
    if mode == "sharded":
        return x, y
    half = len(x) // NUM_TRAINERS
    return x[trainer * half:(trainer + 1) * half], y[trainer * half:(trainer + 1) * half]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--trainer", type=int, required=True)
    parser.add_argument("--mode", choices=["sharded", "replicated"], required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    model = make_mlp(MODEL_SEED)
    x, y = trainer_batch(args.trainer, args.mode)
    with optstep.Client(args.server, stream_timeout=60) as client:
        opt = RemoteOptimizer(model, client, optimizer=optimizer_config(),
                              session_name=args.session, trainer_id=args.trainer,
                              num_trainers=NUM_TRAINERS, gradient_mode=args.mode)
        train(model, opt, x, y, STEPS)
        assert opt.last_step.step == STEPS
    np.savez(args.out, **{n: p.detach().numpy() for n, p in model.named_parameters()})


if __name__ == "__main__":
    main()
