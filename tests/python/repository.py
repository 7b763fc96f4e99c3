"""The checkout these tests run in (tests/python/ -> ../..), where bazel builds the binaries."""

from __future__ import annotations

import pathlib

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]
