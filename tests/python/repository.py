"""The checkout these tests run in (tests/python/ -> ../..), where bazel builds the binaries."""

from __future__ import annotations

import os
import pathlib
import subprocess

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]


def server_binary_path() -> str:
    """$OPTSTEP_SERVER, else bazel-bin/server/optstep_server, built when missing."""
    override = os.environ.get("OPTSTEP_SERVER")
    binary = (pathlib.Path(override) if override
              else REPOSITORY_ROOT / "bazel-bin" / "server" / "optstep_server")
    if not binary.is_file() and not override:
        subprocess.run(["bazel", "build", "//server:optstep_server"], cwd=REPOSITORY_ROOT,
                       check=True)
    assert binary.is_file(), f"no server binary at {binary}"
    return str(binary)


def native_library_path() -> str:
    """bazel-bin/client/python/native/liboptstep_native.so (the Python client's native data
    path), built when missing."""
    library = (REPOSITORY_ROOT / "bazel-bin" / "client" / "python" / "native" /
               "liboptstep_native.so")
    if not library.is_file():
        subprocess.run(["bazel", "build", "//client/python/native:liboptstep_native.so"],
                       cwd=REPOSITORY_ROOT, check=True)
    assert library.is_file(), f"no native library at {library}"
    return str(library)
