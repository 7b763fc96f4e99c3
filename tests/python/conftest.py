"""Fixtures of the Python client tests: one real optstep server process (CPU, port 0) for the
whole run, and a connected client per test.

The server binary is $OPTSTEP_SERVER, else bazel-bin/server/optstep_server, which is built with
`bazel build //server:optstep_server` when missing.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Iterator

import pytest

import optstep
from repository import REPOSITORY_ROOT


@pytest.fixture(scope="session")
def server_binary() -> str:
    override = os.environ.get("OPTSTEP_SERVER")
    binary = (pathlib.Path(override) if override
              else REPOSITORY_ROOT / "bazel-bin" / "server" / "optstep_server")
    if not binary.is_file() and not override:
        subprocess.run(["bazel", "build", "//server:optstep_server"], cwd=REPOSITORY_ROOT,
                       check=True)
    assert binary.is_file(), f"no server binary at {binary}"
    return str(binary)


@pytest.fixture(scope="session")
def server(server_binary: str) -> Iterator[optstep.LocalServer]:
    with optstep.LocalServer(server_binary, flags=["--max_sessions=1024"]) as local:
        yield local


@pytest.fixture
def client(server: optstep.LocalServer) -> Iterator[optstep.Client]:
    with optstep.Client(server.address) as connected:
        yield connected
