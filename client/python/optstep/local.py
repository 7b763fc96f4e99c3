"""Local optstep server processes, for tests, demos and notebooks.

    with LocalServer() as server:            # bazel-bin/server/optstep_server --port=0 (CPU)
        client = optstep.Client(server.address)
    with LocalGroup(2) as group:             # two ranks; rank 0 serves the rendezvous
        client = optstep.Client(rank_targets=group.targets)

The binary is the `binary` argument, else $OPTSTEP_SERVER, else (when this package runs from a
source checkout) the checkout's bazel-bin/server/optstep_server. The server picks a free port and
prints ``listening on HOST:PORT`` first; its output goes to a log file (``server.log_path``), whose
tail the error quotes when a server does not start or does not become SERVING. A LocalServer is
rank 0 of 1 unless its flags say otherwise, whatever the environment holds (torchrun's
``WORLD_SIZE`` is the trainers', not the server's).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import subprocess
import tempfile
import time
from typing import IO, Any, List, NoReturn, Optional, Sequence, Union

from optstep._checkout import checkout_server_binary
from optstep.client import Client
from optstep.errors import OptstepError

__all__ = ["LocalServer", "LocalGroup", "default_server_binary"]

_LISTENING = re.compile(r"^listening on (\S+)(.*)$", re.MULTILINE)
# How much of a server's log an error quotes.
_LOG_TAIL_LINES = 40

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
    """One optstep_server rank on 127.0.0.1 and a free port; stopped on exit (SIGTERM).

    ``start`` waits until the server's health is SERVING when `wait_serving` (a rank of a group
    serves only once the group has formed: LocalGroup waits for that itself), unless the server
    serves TLS (its health then needs the caller's credentials)."""

    def __init__(self, binary: Optional[PathLike] = None, flags: Sequence[str] = (),
                 host: str = "127.0.0.1", start_timeout: float = 30.0,
                 wait_serving: bool = True) -> None:
        self.binary = pathlib.Path(binary) if binary else default_server_binary()
        self.flags = list(flags)
        self.host = host
        self.start_timeout = start_timeout
        self.wait_serving = wait_serving
        self.tls = False  # the server serves TLS (known once it listens)
        self.address: Optional[str] = None
        self.log_path: Optional[pathlib.Path] = None
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    def start(self) -> str:
        """Starts the server and answers its address; RuntimeError (quoting the tail of the
        server's log) when it does not come up, or (`wait_serving`) does not become SERVING,
        within `start_timeout` seconds."""
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
        # Rank 0 of 1 unless the flags (later on the command line, so they win) say otherwise.
        self._process = subprocess.Popen(
            [str(self.binary), "--port=0", f"--host={self.host}", "--rank=0", "--world_size=1",
             *self.flags],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.address is None:
            found = _LISTENING.search(self.log())
            if found:
                self.address = found.group(1)
                self.tls = ", tls)" in found.group(2)
            elif self._process.poll() is not None:
                self._fail("did not start")
            else:
                time.sleep(0.05)
        if self.address is None:
            self._fail(f"did not start within {self.start_timeout:g} s")
        # A TLS server's health needs its credentials, which the caller holds: not waited for.
        if self.wait_serving and not self.tls:
            self.await_serving(deadline)
        return self.address

    def await_serving(self, deadline: float) -> None:
        """Waits until the server's health is SERVING; RuntimeError (the server stopped, with
        the tail of its log) when it exits or `deadline` (time.monotonic()) passes first."""
        assert self.address is not None and self._process is not None
        with Client(self.address, connect_timeout=0, rpc_timeout=1.0) as client:
            while True:
                with contextlib.suppress(OptstepError):
                    if client.check_health():
                        return
                if self._process.poll() is not None:
                    self._fail("exited before it was SERVING")
                if time.monotonic() >= deadline:
                    self._fail(f"did not become SERVING within {self.start_timeout:g} s")
                time.sleep(0.05)

    def _fail(self, what: str) -> NoReturn:
        status = self._process.poll() if self._process is not None else None
        tail = self.log_tail()
        self.stop()
        exited = f" (exit status {status})" if status is not None else ""
        raise RuntimeError(f"optstep server {' '.join(self.flags)} {what}{exited}; the end of its "
                           f"log {self.log_path}:\n{tail}")

    def log(self) -> str:
        """What the server has printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last `lines` lines the server has printed."""
        return "\n".join(self.log().splitlines()[-lines:])

    def wait(self, timeout: float) -> int:
        """Waits for the server to exit by itself (e.g. after Client.shutdown); answers its exit
        status. subprocess.TimeoutExpired when it still runs after `timeout` seconds."""
        if self._process is None:
            raise RuntimeError("optstep server not started")
        return self._process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILLs the server (a rank lost as to a crash) and waits for it; its log stays."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

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
                self.ranks.append(LocalServer(self.binary, flags, start_timeout=self.start_timeout,
                                              wait_serving=False))
                self.ranks[-1].start()
            # Every rank serves once the group has formed.
            deadline = time.monotonic() + self.start_timeout
            for rank in self.ranks:
                if not rank.tls:
                    rank.await_serving(deadline)
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
