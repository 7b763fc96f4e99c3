"""client/python/examples/hf_trainer.py: a Hugging Face Trainer (tiny GPT-2) with optstep's
AdamW matches torch's AdamW over 20 steps, and resumes from its own checkpoint bit for bit."""

from __future__ import annotations

import pathlib

import pytest

import optstep
from examples_support import assert_bit_identical, assert_close, assert_models_close, load_example

pytest.importorskip("transformers")
hf = load_example("hf_trainer")
STEPS = 20


def test_optstep_matches_torch_and_resumes_bit_for_bit(client: optstep.Client,
                                                        tmp_path: pathlib.Path) -> None:
    remote, remote_losses = hf.train(tmp_path / "remote", STEPS, client, save_steps=STEPS // 2)
    local, local_losses = hf.train(tmp_path / "local", STEPS, None)
    assert len(remote_losses) == STEPS
    assert_close(remote_losses, local_losses, STEPS)
    assert_models_close(remote, local)

    resumed, resumed_losses = hf.train(tmp_path / "resumed", STEPS, client,
                                       resume=str(tmp_path / "remote" / f"checkpoint-{STEPS // 2}"))
    # The Trainer's history holds the checkpoint's first half, then the steps run again.
    assert resumed_losses == remote_losses
    assert_bit_identical(resumed, remote)
