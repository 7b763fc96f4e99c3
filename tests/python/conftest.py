"""Fixtures of the Python client tests: one real optstep server process (CPU, port 0) for the
whole run, and a connected client per test.

The server binary is $OPTSTEP_SERVER, else bazel-bin/server/optstep_server, which is built with
`bazel build //server:optstep_server` when missing.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

import optstep
from optstep import native
from repository import native_library_path, server_binary_path


# The tests of the streams' data paths (native and pure Python) keep to them: steps through shared
# memory are what tests/python/test_shared_memory.py asks for (Client(shared_memory=True)).
os.environ.setdefault("OPTSTEP_SHARED_MEMORY", "0")


@pytest.fixture(scope="session")
def server_binary() -> str:
    return server_binary_path()


@pytest.fixture(scope="session")
def server(server_binary: str) -> Iterator[optstep.LocalServer]:
    with optstep.LocalServer(server_binary, flags=["--max_sessions=1024"]) as local:
        yield local


@pytest.fixture
def client(server: optstep.LocalServer) -> Iterator[optstep.Client]:
    with optstep.Client(server.address) as connected:
        yield connected


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The streams' data path of the test's clients: the native one (the C++ client) or the
    pure-Python one."""
    if not native.library_path().is_file():
        monkeypatch.setenv("OPTSTEP_NATIVE_LIB", native_library_path())
    monkeypatch.setenv("OPTSTEP_NATIVE", "1" if request.param == "native" else "0")
    assert native.available() == (request.param == "native")
    return str(request.param)
