"""The checkout these tests run in (tests/python/ -> ../..), where bazel builds the binaries."""

from __future__ import annotations

import os
import pathlib
import subprocess

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]


def bazel_binary_path(override_variable: str, label: str) -> str:
    """$`override_variable`, else the bazel-bin path of the binary `label` ("//pkg:name"), built
    when missing."""
    override = os.environ.get(override_variable)
    package, name = label[2:].split(":")
    binary = (pathlib.Path(override) if override
              else REPOSITORY_ROOT / "bazel-bin" / package / name)
    if not binary.is_file() and not override:
        subprocess.run(["bazel", "build", label], cwd=REPOSITORY_ROOT, check=True)
    assert binary.is_file(), f"no {label} binary at {binary}"
    return str(binary)


def server_binary_path() -> str:
    """$OPTSTEP_SERVER, else bazel-bin/server/optstep_server, built when missing."""
    return bazel_binary_path("OPTSTEP_SERVER", "//server:optstep_server")


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
