"""What the trainer examples share: their --server / --local / --steps options and the optstep
client a run uses (None with --local: the local torch optimizer)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator, Optional

import optstep


def add_arguments(parser: argparse.ArgumentParser, steps: int = 20) -> None:
    parser.add_argument("--server", help="optstep server (default: a local one)")
    parser.add_argument("--local", action="store_true", help="torch's AdamW instead")
    parser.add_argument("--steps", type=int, default=steps)


@contextlib.contextmanager
def connect(options: argparse.Namespace) -> Iterator[Optional[optstep.Client]]:
    """A client of --server, else of a local CPU server started here; None with --local."""
    if options.local:
        yield None
    elif options.server:
        with optstep.Client(options.server) as client:
            yield client
    else:
        with optstep.LocalServer() as started, optstep.Client(started.address) as client:
            yield client
