"""The installed package: its version, where LocalServer finds the server binary, and
LocalGroup.wait."""

from __future__ import annotations

import importlib.metadata
import pathlib

import pytest

import optstep
import optstep.local
from repository import REPOSITORY_ROOT


def test_version_is_the_distributions() -> None:
    assert optstep.__version__ == importlib.metadata.version("optstep")


def test_the_binary_is_optstep_server_then_the_checkouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTSTEP_SERVER", "/opt/optstep/bin/optstep_server")
    assert optstep.LocalServer().binary == pathlib.Path("/opt/optstep/bin/optstep_server")
    monkeypatch.delenv("OPTSTEP_SERVER")
    # These tests run the package from this checkout (an editable install).
    assert optstep.LocalServer().binary == REPOSITORY_ROOT / "bazel-bin/server/optstep_server"


def test_without_a_checkout_the_binary_must_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTSTEP_SERVER", raising=False)
    monkeypatch.setattr(optstep.local, "checkout_server_binary", lambda: None)
    with pytest.raises(FileNotFoundError, match="OPTSTEP_SERVER"):
        optstep.LocalServer().start()
    assert not hasattr(optstep.local, "repository_root")


def test_a_group_waits_for_every_rank(server_binary: str) -> None:
    with optstep.LocalGroup(2, server_binary) as group:
        with optstep.Client(rank_targets=group.targets) as admin:
            admin.shutdown(rank=1, reason="python test")
            admin.shutdown(rank=0, reason="python test")
        assert group.wait(timeout=30) == [0, 0]
