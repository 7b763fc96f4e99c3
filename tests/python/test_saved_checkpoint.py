"""A checkpoint saved by a real group of two ranks is readable without optstep: the shards with
the `safetensors` package hold every master and optimizer state tensor (SOAP's L, R, Q_L, Q_R;
NorMuon's moment2_buffer, shaped like neither factor nor parameter) with the values that
ExportStateDict answers, each on the rank the manifest says owns its parameter."""

from __future__ import annotations

import json
import pathlib
from typing import Dict, Iterator

import numpy as np
import pytest
from safetensors import safe_open

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import make_data, make_mlp, train


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def group(server_binary: str, root: pathlib.Path) -> Iterator[optstep.LocalGroup]:
    with optstep.LocalGroup(2, server_binary, flags=[f"--checkpoint_root={root}"]) as two:
        yield two


def _shards(directory: pathlib.Path) -> Dict[int, Dict[str, np.ndarray]]:
    manifest = json.loads((directory / "manifest.json").read_text())
    out = {}
    for rank, shard in enumerate(manifest["shards"]):
        with safe_open(str(directory / shard["file"]), framework="numpy") as f:
            out[rank] = {key: f.get_tensor(key) for key in f.keys()}
    return out


@pytest.mark.parametrize("name,optimizer", [
    ("soap", config.soap_chain(precondition_frequency=1)),
    ("normuon", config.chain(config.adaptive_muon(lr=0.02, moment2_method="normuon"),
                             config.adamw(lr=3e-3))),
])
def test_real_shards_hold_every_state_tensor(group: optstep.LocalGroup, root: pathlib.Path,
                                             name: str, optimizer) -> None:
    x, y = make_data(5)
    model = make_mlp(4)
    with optstep.Client(rank_targets=group.targets) as client:
        opt = RemoteOptimizer(model, client, optimizer=optimizer)
        train(model, opt, x, y, 3)
        progress = client.save_checkpoint(opt.session_id, name)
        assert progress.step == 3
        exported = client.export_state_dict(opt.session_id)
        owners = {p.name: p.owner for p in client.layout(opt.session_id).params}

    directory = root / name
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["step"] == 3
    shards = _shards(directory)
    in_shards = {key for tensors in shards.values() for key in tensors}
    assert in_shards == set(exported)
    for key, want in exported.items():
        parts = key.split("/")
        param = parts[1] if parts[0] == "param" else parts[2] if len(parts) == 4 else None
        holders = [rank for rank, tensors in shards.items() if key in tensors]
        if param in owners:
            assert holders == [owners[param]], key  # on its owner only
        for rank in holders:
            np.testing.assert_array_equal(shards[rank][key], want, err_msg=key)

    # The hidden matrices go to the matrix optimizer; the output layer and the biases to AdamW.
    sub = "soap" if name == "soap" else "adaptive_muon"
    matrices = {n: tuple(p.shape) for n, p in model.named_parameters()
                if p.ndim == 2 and any(k.startswith(f"state/{sub}/{n}/") for k in exported)}
    assert len(matrices) == 2, sorted(exported)
    for param, (m, n) in matrices.items():
        if name == "soap":
            shapes = {"L": (m, m), "R": (n, n), "Q_L": (m, m), "Q_R": (n, n),
                      "exp_avg": (m, n), "exp_avg_sq": (m, n)}
        else:
            # normuon keeps one second moment per row or column along the shorter side.
            key = f"state/{sub}/{param}/moment2_buffer"
            assert key in exported, sorted(exported)
            assert exported[key].size == min(m, n) or exported[key].size == max(m, n), key
            shapes = {"momentum_buffer": (m, n)}
        for leaf, shape in shapes.items():
            key = f"state/{sub}/{param}/{leaf}"
            assert key in exported, (key, sorted(exported))
            assert exported[key].shape == shape, key
            assert np.isfinite(exported[key]).all(), key


def test_a_load_of_an_earlier_checkpoint_resets_what_the_client_saw_applied(
        group: optstep.LocalGroup) -> None:
    """After a Load takes the session back to step 2, a step sent out of sequence is the
    caller's mistake (FailedPreconditionError), not a rewind of the group. Before, the client
    still took step 4, seen applied, for the session's, and raised RewindRequired."""
    grads = {"0.weight": np.ones((16, 8), np.float32)}
    with optstep.Client(rank_targets=group.targets) as client:
        spec = optstep.pb.SessionSpec(
            num_trainers=1, gradient_mode=optstep.pb.GRADIENT_MODE_REPLICATED,
            parameters=[optstep.pb.ParameterSpec(name="0.weight", shape=[16, 8])],
            optimizer=config.chain(config.sgd(lr=0.1)))
        sid = client.create_session(spec)[0].session_id
        for step in (1, 2):
            client.step(sid, step, grads)
        client.save_checkpoint(sid, "back")
        for step in (3, 4):
            client.step(sid, step, grads)
        assert client.load_checkpoint(sid, "back").step == 2
        with pytest.raises(optstep.FailedPreconditionError) as refused:
            client.step(sid, 5, grads)
        assert not isinstance(refused.value, optstep.RewindRequired)
        assert client.step(sid, 3, grads).step == 3
        client.close_session(sid)
