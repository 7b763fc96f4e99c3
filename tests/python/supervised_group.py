"""A group of ranks on loopback under deploy/local/ranks.sh, whose supervisor restarts a rank that
exits or is killed (same port, same flags), with automatic checkpoints: what the recovery and
chaos tests kill and watch heal."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
from typing import Any, List, Sequence

from repository import REPOSITORY_ROOT

RANKS_SH = REPOSITORY_ROOT / "deploy" / "local" / "ranks.sh"
# Loss of a peer is found within a second and the group restarts a second later.
FAST_HEALING = ["--heartbeat_interval_ms=100", "--peer_timeout_ms=1000"]


class SupervisedGroup:
    """`world_size` supervised ranks saving every `every_steps` steps under `directory`/ckpt."""

    def __init__(self, binary: str, world_size: int, directory: pathlib.Path,
                 every_steps: int = 1, flags: Sequence[str] = ()) -> None:
        self.binary = binary
        self.world_size = world_size
        self.directory = directory
        self.checkpoint_root = directory / "ckpt"
        self.flags = [f"--checkpoint_root={self.checkpoint_root}",
                      f"--checkpoint_every_steps={every_steps}", *FAST_HEALING, *flags]
        self.targets: List[str] = []

    def start(self) -> List[str]:
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OPTSTEP_SERVER=self.binary, OPTSTEP_MAX_RESTARTS="50",
                   OPTSTEP_RESTART_DELAY="0.2")
        subprocess.run([str(RANKS_SH), "start", str(self.world_size), str(self.directory),
                        "--", *self.flags], env=env, check=True, stdout=subprocess.DEVNULL,
                       timeout=60)
        self.targets = (self.directory / "targets").read_text().split()
        return self.targets

    def stop(self) -> None:
        subprocess.run([str(RANKS_SH), "stop", str(self.directory)], check=False, timeout=60)

    def rank_pid(self, rank: int, timeout: float = 30.0) -> int:
        """The pid of rank `rank`'s server process now (waiting while it is being restarted)."""
        supervisor = (self.directory / "pids").read_text().split()[rank]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", supervisor],
                                      capture_output=True, text=True).stdout.split("\n")
            for line in children:
                fields = line.split()
                if len(fields) == 2 and fields[1].startswith("optstep_server"):
                    return int(fields[0])
            time.sleep(0.02)
        raise TimeoutError(f"rank {rank} has no server process after {timeout} s")

    def kill(self, *ranks: int) -> float:
        """SIGKILLs the given ranks' servers; answers when (time.monotonic())."""
        pids = [self.rank_pid(r) for r in ranks]
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return killed

    def hold(self, rank: int) -> None:
        """Stops rank `rank`'s supervisor (SIGSTOP): a rank killed now stays away until
        :meth:`release`."""
        os.kill(self._supervisor(rank), signal.SIGSTOP)

    def release(self, rank: int) -> None:
        """Lets rank `rank`'s supervisor go on (SIGCONT): it restarts the rank if it died."""
        os.kill(self._supervisor(rank), signal.SIGCONT)

    def _supervisor(self, rank: int) -> int:
        return int((self.directory / "pids").read_text().split()[rank])

    def log(self, rank: int) -> str:
        return (self.directory / f"rank-{rank}.log").read_text(errors="replace")

    def checkpoint_done(self, session_id: str, step: int) -> bool:
        return (self.checkpoint_root / "auto" / session_id / f"step-{step}" /
                "manifest.json").exists()

    def await_checkpoint(self, session_id: str, step: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.checkpoint_done(session_id, step):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no automatic checkpoint of step {step} of session "
                                   f"'{session_id}' within {timeout} s")
            time.sleep(0.02)

    def __enter__(self) -> "SupervisedGroup":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
