#!/usr/bin/env python3
"""Steps through a stand-in (docs/deploy.md, "A rank that does not return").

Three real server processes on loopback hold a session of square matrices with the Muon chain
(Newton–Schulz: GEMMs whose threads fill the cores). A trainer steps it, rank 1 is killed and kept
away past --rejoin_timeout_ms, its buddy (rank 2) stands in for it in its own process, and the
trainer steps on through the stand-in. Prints the median step wall before the loss and through
the stand-in, and their ratio: the host then does two ranks' work on the same cores.

    bazel build //server:optstep_server //client/python/native:liboptstep_native.so
    python3 bench/stand_in_bench.py [--server=bazel-bin/server/optstep_server]

Run it with the repository's virtualenv (the optstep package, numpy).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "client" / "python"))

import optstep  # noqa: E402
from optstep import config, pb  # noqa: E402

WORLD = 3
FLAGS = ["--heartbeat_interval_ms=100", "--peer_timeout_ms=1000", "--state_redundancy=1",
         "--rejoin_timeout_ms=2000"]


def _spec(matrices: int, size: int) -> pb.SessionSpec:
    return pb.SessionSpec(name="stand-in-bench", num_trainers=1,
                          gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name=f"w{i}", shape=[size, size])
                                      for i in range(matrices)],
                          optimizer=config.muon_chain(lr=0.02))


def _gradients(step: int, matrices: int, size: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {f"w{i}": rng.standard_normal((size, size), dtype=np.float32)
            for i in range(matrices)}


def _timed_steps(client: optstep.Client, sid: str, first: int, count: int, matrices: int,
                 size: int) -> List[float]:
    walls = []
    for step in range(first, first + count):
        grads = _gradients(step, matrices, size)
        began = time.monotonic()
        client.step(sid, step, grads)
        walls.append(time.monotonic() - began)
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="bazel-bin/server/optstep_server")
    parser.add_argument("--matrices", type=int, default=12)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6, help="timed steps before and after")
    args = parser.parse_args()
    with optstep.LocalGroup(WORLD, args.server, flags=FLAGS) as group, \
            optstep.Client(rank_targets=group.targets, recovery_timeout=120) as client:
        info, _ = client.create_session(_spec(args.matrices, args.size))
        sid = info.session_id
        _timed_steps(client, sid, 1, 1, args.matrices, args.size)  # warm-up
        before = _timed_steps(client, sid, 2, args.steps, args.matrices, args.size)
        step = 2 + args.steps
        group.ranks[1].kill()
        # Waits out the rejoin timeout and the stand-in's heal, then is redone on the stand-in.
        _timed_steps(client, sid, step, 1, args.matrices, args.size)
        layout = client.layout(sid, refresh=True)
        assert layout.stood_in_ranks == (1,), layout.stood_in_ranks
        through = _timed_steps(client, sid, step + 1, args.steps, args.matrices, args.size)
    b, t = statistics.median(before), statistics.median(through)
    print(f"{args.matrices} matrices of {args.size}x{args.size} (Muon), {WORLD} ranks: median "
          f"step wall {b * 1e3:.0f} ms before the loss, {t * 1e3:.0f} ms through the stand-in "
          f"({t / b:.2f}x); steps before {[round(w * 1e3) for w in before]} ms, through "
          f"{[round(w * 1e3) for w in through]} ms")


if __name__ == "__main__":
    main()
