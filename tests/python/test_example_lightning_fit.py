"""client/python/examples/lightning_fit.py: a Lightning module with optstep's AdamW matches
torch's AdamW over 20 steps, and resumes from Lightning's own checkpoint (written when a fit of 10 steps ended) bit for bit."""

from __future__ import annotations

import pathlib

import pytest

import optstep
from examples_support import assert_bit_identical, assert_close, assert_models_close, load_example

pytest.importorskip("lightning")
example = load_example("lightning_fit")
STEPS = 20  # two epochs of 10 batches


def test_optstep_matches_torch_and_resumes_bit_for_bit(client: optstep.Client,
                                                        tmp_path: pathlib.Path) -> None:
    remote = example.fit(STEPS, client)
    local = example.fit(STEPS, None)
    assert_close(remote.losses, local.losses, STEPS)
    assert_models_close(remote, local)

    checkpoint = str(tmp_path / "first-epoch.ckpt")
    first = example.fit(STEPS // 2, client, save=checkpoint)
    assert first.losses == remote.losses[:STEPS // 2]
    resumed = example.fit(STEPS, client, resume=checkpoint)
    assert resumed.losses == remote.losses[STEPS // 2:]
    assert_bit_identical(resumed, remote)
