"""Local optstep server processes, for tests, demos and notebooks.

    with LocalServer() as server:            # bazel-bin/server/optstep_server --port=0 (CPU)
        client = optstep.Client(server.address)
    with LocalGroup(2) as group:             # two ranks; rank 0 serves the rendezvous
        client = optstep.Client(rank_targets=group.targets)

The binary is the `binary` argument, else $OPTSTEP_SERVER, else (when this package runs from a
source checkout) the checkout's bazel-bin/server/optstep_server. The server picks a free port and
prints ``listening on HOST:PORT`` first; its output goes to a log file (``server.log_path``).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tempfile
import time
from typing import IO, Any, List, Optional, Sequence, Union

from optstep._checkout import checkout_server_binary

__all__ = ["LocalServer", "LocalGroup", "default_server_binary"]

_LISTENING = re.compile(r"^listening on (\S+)", re.MULTILINE)

#: A path to the server binary.
PathLike = Union[str, "os.PathLike[str]"]


def default_server_binary() -> Optional[pathlib.Path]:
    """$OPTSTEP_SERVER, else the source checkout's bazel-bin/server/optstep_server (built or
    not), else None."""
    override = os.environ.get("OPTSTEP_SERVER")
    if override:
        return pathlib.Path(override)
    return checkout_server_binary()


class LocalServer:
    """One optstep_server rank on 127.0.0.1 and a free port; stopped on exit (SIGTERM)."""

    def __init__(self, binary: Optional[PathLike] = None, flags: Sequence[str] = (),
                 host: str = "127.0.0.1", start_timeout: float = 30.0) -> None:
        self.binary = pathlib.Path(binary) if binary else default_server_binary()
        self.flags = list(flags)
        self.host = host
        self.start_timeout = start_timeout
        self.address: Optional[str] = None
        self.log_path: Optional[pathlib.Path] = None
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    def start(self) -> str:
        """Starts the server and answers its address; RuntimeError when it does not come up."""
        if self.binary is None:
            raise FileNotFoundError("no optstep server binary: pass one, or set OPTSTEP_SERVER")
        if not self.binary.is_file():
            raise FileNotFoundError(f"optstep server binary not found at {self.binary} (build it "
                                    "with `bazel build //server:optstep_server`, or set "
                                    "OPTSTEP_SERVER)")
        fd, name = tempfile.mkstemp(prefix="optstep-server.", suffix=".log")
        os.close(fd)
        self.log_path = pathlib.Path(name)
        self._log = open(self.log_path, "wb")
        self._process = subprocess.Popen(
            [str(self.binary), "--port=0", f"--host={self.host}", *self.flags],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            found = _LISTENING.search(self.log())
            if found:
                self.address = found.group(1)
                return self.address
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        output = self.log()
        self.stop()
        raise RuntimeError(f"optstep server did not start:\n{output}")

    def log(self) -> str:
        """What the server has printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def wait(self, timeout: float) -> int:
        """Waits for the server to exit by itself (e.g. after Client.shutdown); answers its exit
        status. subprocess.TimeoutExpired when it still runs after `timeout` seconds."""
        if self._process is None:
            raise RuntimeError("optstep server not started")
        return self._process.wait(timeout=timeout)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Stops the server and removes its log."""
        self.stop()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalGroup:
    """`world_size` ranks on 127.0.0.1, as deploy/local/ranks.sh runs them: rank 0 first (it
    serves the rendezvous), then the others pointed at it. ``targets`` are their addresses."""

    def __init__(self, world_size: int, binary: Optional[PathLike] = None,
                 flags: Sequence[str] = (), start_timeout: float = 60.0) -> None:
        self.world_size = world_size
        self.binary = binary
        self.flags = list(flags)
        self.start_timeout = start_timeout
        self.ranks: List[LocalServer] = []

    @property
    def targets(self) -> List[str]:
        return [rank.address or "" for rank in self.ranks]

    def start(self) -> List[str]:
        try:
            for r in range(self.world_size):
                flags = [f"--rank={r}", f"--world_size={self.world_size}", *self.flags]
                if r > 0:
                    flags.append(f"--rendezvous={self.ranks[0].address}")
                self.ranks.append(LocalServer(self.binary, flags, start_timeout=self.start_timeout))
                self.ranks[-1].start()
        except BaseException:
            self.stop()
            raise
        return self.targets

    def wait(self, timeout: float) -> List[int]:
        """Waits for every rank to exit by itself (e.g. after Client.shutdown of each); answers
        their exit statuses by rank. subprocess.TimeoutExpired when one still runs after
        `timeout` seconds (counted from the call)."""
        deadline = time.monotonic() + timeout
        return [rank.wait(max(0.0, deadline - time.monotonic())) for rank in self.ranks]

    def stop(self) -> None:
        for rank in reversed(self.ranks):
            rank.stop()

    def __enter__(self) -> "LocalGroup":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for rank in reversed(self.ranks):
            rank.close()
