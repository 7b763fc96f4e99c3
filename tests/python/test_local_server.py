"""Where a server learns its place in a group, and how it ends while it waits for the group.

A LocalServer is rank 0 of 1 whatever the trainers' environment holds (torchrun sets
WORLD_SIZE and RANK for the trainers); the server itself reads only --world_size and
$OPTSTEP_WORLD_SIZE. A server that does not become SERVING is reported with the tail of its log.
A rank still waiting for its group ends at once on SIGTERM (status 128 + 15), and a group that
does not form within --comm_timeout_ms ends the rank (status 75) even with
--exit_on_peer_loss=false.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Dict, Iterator, Optional, Sequence

import numpy as np
import pytest

import optstep
from optstep import pb

_LISTENING = re.compile(r"listening on \S+ \(.*rank (\d+) of (\d+)")


class _Rank:
    """The server binary run directly (no LocalServer defaults), its output in a pipe."""

    def __init__(self, binary: str, flags: Sequence[str], env: Optional[Dict[str, str]]) -> None:
        self.process = subprocess.Popen([binary, "--port=0", "--host=127.0.0.1", *flags],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, text=True)
        assert self.process.stdout is not None
        self.lines = []  # up to "listening on ..." (or the end of the output)
        for line in self.process.stdout:
            self.lines.append(line)
            if _LISTENING.search(line):
                break
        self.listening = self.lines[-1] if self.lines else ""

    def output(self) -> str:
        assert self.process.stdout is not None
        return "".join(self.lines) + self.process.stdout.read()


@pytest.fixture
def run_rank(server_binary: str) -> Iterator:
    started = []

    def run(flags: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> _Rank:
        started.append(_Rank(server_binary, flags, env))
        return started[-1]

    yield run
    for rank in started:
        if rank.process.poll() is None:
            rank.process.kill()
        rank.process.wait()


def _env(**values: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "OPTSTEP_WORLD_SIZE")}
    env.update(values)
    return env


def test_the_server_reads_optstep_world_size_not_the_trainers(run_rank) -> None:
    trainers = run_rank(env=_env(WORLD_SIZE="2", RANK="1"))
    assert _LISTENING.search(trainers.listening).groups() == ("0", "1"), trainers.listening
    ranks = run_rank(env=_env(OPTSTEP_WORLD_SIZE="2"))
    assert _LISTENING.search(ranks.listening).groups() == ("0", "2"), ranks.listening


def test_a_local_server_in_a_torchrun_worker_steps(server_binary: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                        "OPTSTEP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with optstep.LocalServer(server_binary, start_timeout=10) as server, \
            optstep.Client(server.address) as client:
        spec = pb.SessionSpec(name="torchrun-worker", num_trainers=1,
                              gradient_mode=pb.GRADIENT_MODE_REPLICATED, optimizer=optstep.config.chain(
            optstep.config.sgd(lr=0.5), clip_grad=0))
        spec.parameters.add(name="w", shape=[3])
        info, _ = client.create_session(spec)
        client.init_parameters(info.session_id, {"w": np.ones(3, np.float32)})
        reply = client.step(info.session_id, 1, {"w": np.ones(3, np.float32)})
        np.testing.assert_allclose(reply.params[0], np.full(3, 0.5, np.float32))


def test_a_server_that_is_not_serving_is_reported_with_its_log(server_binary: str) -> None:
    server = optstep.LocalServer(server_binary, flags=["--world_size=2", "--comm_timeout_ms=60000"],
                                 start_timeout=1.0)
    with pytest.raises(RuntimeError, match=r"(?s)did not become SERVING within 1 s.*rank 0 of 2"):
        server.start()
    server.close()


def test_a_server_that_cannot_start_is_reported_with_its_log(server_binary: str) -> None:
    server = optstep.LocalServer(server_binary, flags=["--device=abacus"])
    with pytest.raises(RuntimeError, match=r"(?s)did not start \(exit status [1-9].*abacus"):
        server.start()
    server.close()


def test_sigterm_while_waiting_for_the_group_ends_the_rank_at_once(run_rank) -> None:
    rank = run_rank(["--rank=0", "--world_size=2", "--comm_timeout_ms=60000"])
    assert _LISTENING.search(rank.listening), rank.listening
    begin = time.monotonic()
    rank.process.send_signal(signal.SIGTERM)
    assert rank.process.wait(timeout=10) == 128 + signal.SIGTERM
    assert time.monotonic() - begin < 10
    assert "event=shutdown_while_joining" in rank.output()


def test_a_group_that_does_not_form_ends_the_rank(run_rank) -> None:
    rank = run_rank(["--rank=0", "--world_size=2", "--comm_timeout_ms=500",
                     "--exit_on_peer_loss=false"])
    assert rank.process.wait(timeout=15) == 75
    assert "the group did not form" in rank.output()
