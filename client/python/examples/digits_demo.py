"""The demo of `make demo`: trains an MLP on scikit-learn's handwritten digits through an optstep
server with the chained Muon + AdamW optimizer, then compares training curves.

    digits_demo.py [--server HOST:PORT] [--epochs 12] [--plot build/demo/digits.png]

Without --server it starts a local CPU server (bazel-bin/server/optstep_server, or
$OPTSTEP_SERVER). Muon takes the hidden matrices; AdamW the output layer and the biases (spec
§4 routing, built by optstep.torch from the model). Prints loss and accuracy per epoch and exits
non-zero unless the test accuracy reaches --target. With --plot it also trains with AdamW alone
and with the SOAP chain and writes the three curves to a PNG. An optimizer the server does not
provide (UNIMPLEMENTED) is replaced by AdamW, with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import sys
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer

SEED = 0
BATCH = 64
OPTIMIZERS: Dict[str, "optstep.pb.OptimizerConfig"] = {
    # Keller Jordan's Muon setting (Nesterov, shape scaling, lr 0.02) for the hidden matrices.
    "Muon + AdamW": config.muon_chain(lr=0.02, adam_lr=3e-3, momentum=0.95, nesterov=True,
                                      scale_mode="shape_scaling"),
    "SOAP + AdamW": config.soap_chain(lr=3e-3, adam_lr=3e-3),
    "AdamW": config.chain(config.adamw(lr=3e-3, weight_decay=0.01)),
}
FALLBACK = "AdamW"


@dataclasses.dataclass
class Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclasses.dataclass
class Curve:
    name: str
    loss: List[float] = dataclasses.field(default_factory=list)
    test_accuracy: List[float] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def load_data() -> Data:
    """The 1797 8×8 digits that ship with scikit-learn: 80 % train, 20 % test, standardized."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=SEED, stratify=digits.target)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    as_x = lambda x: torch.tensor((x - mean) / std, dtype=torch.float32)  # noqa: E731
    return Data(as_x(x_train), torch.tensor(y_train), as_x(x_test), torch.tensor(y_test))


def make_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def batches(data: Data, epoch: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(epoch))
    for start in range(0, len(order), BATCH):
        index = order[start:start + BATCH]
        yield data.x_train[index], data.y_train[index]


def make_optimizer(name: str, model: nn.Module, client: optstep.Client,
                   fallback: bool) -> Tuple[str, Optional[RemoteOptimizer]]:
    """The optimizer `name`; when the server does not provide it, AdamW (`fallback`) or None."""
    try:
        return name, RemoteOptimizer(model, client, optimizer=OPTIMIZERS[name])
    except optstep.UnimplementedError as e:
        print(f"note: the server does not provide '{name}' ({e.message}); "
              + (f"using {FALLBACK}" if fallback else "left out"))
        if not fallback:
            return name, None
        return FALLBACK, RemoteOptimizer(model, client, optimizer=OPTIMIZERS[FALLBACK])


def train(name: str, client: optstep.Client, data: Data, epochs: int,
          verbose: bool) -> Optional[Curve]:
    """Trains a fresh model with optimizer `name` (main run: `verbose`, falls back to AdamW)."""
    model = make_model()
    used, opt = make_optimizer(name, model, client, fallback=verbose)
    if opt is None:
        return None
    curve = Curve(used)
    groups = ", ".join(f"{g['sub_optimizer']} {len(g['params'])}" for g in opt.param_groups)
    print(f"== {used} through the server (parameters per group: {groups})")
    # Every group's lr decays linearly to 0; the scheduler edits param_groups, the server
    # receives each group's lr with every step.
    total_steps = epochs * -(-len(data.x_train) // BATCH)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / total_steps)
    start = time.monotonic()
    for epoch in range(epochs):
        total, count = 0.0, 0
        for x, y in batches(data, epoch):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            schedule.step()
            total, count = total + loss.item() * len(x), count + len(x)
        curve.loss.append(total / count)
        curve.test_accuracy.append(accuracy(model, data.x_test, data.y_test))
        if verbose:
            print(f"epoch {epoch + 1:2d}  loss {curve.loss[-1]:.4f}  "
                  f"train acc {accuracy(model, data.x_train, data.y_train):6.1%}  "
                  f"test acc {curve.test_accuracy[-1]:6.1%}  ({time.monotonic() - start:.1f} s)")
    curve.seconds = time.monotonic() - start
    opt.close_session()
    return curve


def plot(curves: List[Curve], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for curve in curves:
        epochs = range(1, len(curve.loss) + 1)
        left.plot(epochs, curve.loss, marker="o", label=curve.name)
        right.plot(epochs, [100 * a for a in curve.test_accuracy], marker="o", label=curve.name)
    left.set(xlabel="epoch", ylabel="training loss", yscale="log", title="Training loss")
    right.set(xlabel="epoch", ylabel="test accuracy (%)", title="Test accuracy")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle("MLP on scikit-learn digits, optimizer steps through optstep (CPU)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    print(f"wrote {path}")


@contextlib.contextmanager
def server_address(address: Optional[str]) -> Iterator[str]:
    if address:
        yield address
        return
    with optstep.LocalServer() as local:
        print(f"== optstep server at {local.address} (device cpu)")
        yield local.address


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="host:port of a running server (default: start one)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy to reach")
    parser.add_argument("--plot", type=pathlib.Path, help="also compare optimizers into PNG")
    args = parser.parse_args()

    data = load_data()
    print(f"digits: {len(data.x_train)} training and {len(data.x_test)} test images (8x8)")
    with server_address(args.server) as address, optstep.Client(address) as client:
        main_curve = train("Muon + AdamW", client, data, args.epochs, verbose=True)
        assert main_curve is not None
        final = main_curve.test_accuracy[-1]
        print(f"{main_curve.name}: test accuracy {final:.1%} after {args.epochs} epochs "
              f"in {main_curve.seconds:.1f} s (target {args.target:.0%})")
        if args.plot:
            curves = [main_curve]
            for name in ("SOAP + AdamW", "AdamW"):
                if name == main_curve.name:
                    continue  # the main run fell back to it
                curve = train(name, client, data, args.epochs, verbose=False)
                if curve is not None:
                    print(f"{curve.name}: test accuracy {curve.test_accuracy[-1]:.1%} "
                          f"in {curve.seconds:.1f} s")
                    curves.append(curve)
            plot(curves, args.plot)
    if final < args.target:
        print(f"FAILED: test accuracy {final:.1%} is below the target {args.target:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
