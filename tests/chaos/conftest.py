"""Fixtures of the chaos tests: the server binary, as for tests/python, whose helpers
(supervised groups, the resumable training loop) these tests share."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from repository import server_binary_path  # noqa: E402


@pytest.fixture(scope="session")
def server_binary() -> str:
    return server_binary_path()
