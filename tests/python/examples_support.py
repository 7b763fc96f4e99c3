"""Imports client/python/examples/<name>.py as a module, for the tests of the examples."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Sequence

import torch

from repository import REPOSITORY_ROOT

EXAMPLES = REPOSITORY_ROOT / "client/python/examples"


def load_example(name: str) -> types.ModuleType:
    if str(EXAMPLES) not in sys.path:  # as when the example runs as a script
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(actual: Sequence[float], expected: Sequence[float], steps: int,
                 tolerance: float = 1e-5) -> None:
    """Two runs' losses, step by step, within `tolerance` (absolute)."""
    assert len(actual) == len(expected) == steps, (len(actual), len(expected))
    for step, (a, b) in enumerate(zip(actual, expected), 1):
        assert abs(a - b) <= tolerance, f"step {step}: loss {a} vs {b}"


def assert_models_close(actual: torch.nn.Module, expected: torch.nn.Module,
                        tolerance: float = 1e-5) -> None:
    """Every parameter element within `tolerance`, absolute and relative (AdamW's normalised
    update amplifies rounding differences in entries whose gradients are near zero, so a
    tolerance relative to a tensor's largest entry would be too strict for small biases)."""
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=tolerance, atol=tolerance,
                                   msg=lambda m, name=name: f"param '{name}': {m}")


def assert_bit_identical(actual: torch.nn.Module, expected: torch.nn.Module) -> None:
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        assert torch.equal(a, b), f"param '{name}' differs"
