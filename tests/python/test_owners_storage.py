"""OWNERS parameter storage through the Python client: on three real ranks, where each keeps
only the masters it owns, init, steps (native and pure-Python paths), a pull of all and of some
parameters, two trainers getting bf16 parameters, a state dict export and its import give bit
for bit what a REPLICATED session on the same ranks gives."""

from __future__ import annotations

import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List

import numpy as np
import pytest

import optstep
from optstep import config, pb

SHAPES = {"a.weight": (16, 12), "a.bias": (16,), "b.weight": (8, 16), "b.bias": (8,),
          "c.weight": (5, 8)}


@pytest.fixture(scope="module")
def group(server_binary: str) -> Iterator[optstep.LocalGroup]:
    flags = subprocess.run([server_binary, "--helpfull"], capture_output=True, text=True).stdout
    if "--world_size" not in flags:
        pytest.skip("this server build runs one rank only (no --world_size)")
    with optstep.LocalGroup(3, server_binary) as ranks:
        yield ranks


def _spec(storage: int) -> pb.SessionSpec:
    return pb.SessionSpec(
        name=f"owners-{uuid.uuid4().hex[:8]}", num_trainers=1,
        gradient_mode=pb.GRADIENT_MODE_SHARDED, parameter_storage=storage,
        parameters=[pb.ParameterSpec(name=n, shape=list(s)) for n, s in SHAPES.items()],
        optimizer=config.chain(config.adamw(lr=1e-2, weight_decay=0.1), clip_grad=1.0))


def _values(seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _run(client: optstep.Client, storage: int) -> tuple:
    info, _ = client.create_session(_spec(storage))
    sid = info.session_id
    client.init_parameters(sid, _values(0))
    replies = [client.step(sid, k, _values(k)).params for k in (1, 2, 3)]
    pulled = client.pull_parameters(sid)
    some = client.pull_parameters(sid, params=["c.weight", "a.bias"])
    return sid, replies, pulled, some


@pytest.mark.parametrize("path", ["1", "0"])
def test_owners_match_replicated(group: optstep.LocalGroup, path: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTSTEP_NATIVE", path)
    with optstep.Client(rank_targets=group.targets, stream_timeout=60) as client:
        sid, owned, pulled, some = _run(client, pb.PARAMETER_STORAGE_OWNERS)
        layout = client.layout(sid)
        assert layout.owners_only and len({p.owner for p in layout.params}) > 1
        other, replicated, reference, reference_some = _run(client,
                                                            pb.PARAMETER_STORAGE_REPLICATED)
        assert not client.layout(other).owners_only
    for step_params, step_reference in zip(owned, replicated):
        assert step_params.keys() == step_reference.keys() == set(range(len(SHAPES)))
        for pid, value in step_params.items():
            assert value.tobytes() == step_reference[pid].tobytes()
    # Every parameter comes back from its owner, bit for bit what the last step returned.
    assert pulled.step == reference.step == 3
    assert pulled.params.keys() == reference.params.keys() == set(range(len(SHAPES)))
    for pid, value in pulled.params.items():
        assert value.tobytes() == reference.params[pid].tobytes()
        assert value.tobytes() == owned[-1][pid].tobytes()
    assert sorted(some.params) == sorted(reference_some.params) == [1, 4] and some.step == 3
    for pid, value in some.params.items():
        assert value.tobytes() == reference_some.params[pid].tobytes()


def _two_trainers(clients: List[optstep.Client], sid: str,
                  step: int) -> List[Dict[int, np.ndarray]]:
    """Step `step` of both trainers (REPLICATED gradients, each its own), parameters in bf16."""
    with ThreadPoolExecutor(2) as pool:
        replies = [pool.submit(c.step, sid, step, _values(10 * t + step), trainer_id=t,
                               return_dtype="bf16") for t, c in enumerate(clients)]
        return [r.result().params for r in replies]


def _trained_and_imported(clients: List[optstep.Client], storage: int) -> tuple:
    spec = _spec(storage)
    spec.num_trainers = 2
    spec.gradient_mode = pb.GRADIENT_MODE_REPLICATED
    sid = clients[0].create_session(spec)[0].session_id
    clients[0].init_parameters(sid, _values(0))
    replies = [_two_trainers(clients, sid, k) for k in (1, 2)]
    state = clients[0].export_state_dict(sid)
    spec.name = f"imported-{uuid.uuid4().hex[:8]}"
    imported = clients[0].create_session(spec)[0].session_id
    clients[0].import_state_dict(imported, state)
    pulled = clients[0].pull_parameters(imported)
    replies.append(_two_trainers(clients, imported, 3))
    return replies, state, pulled


def test_owners_two_trainers_bf16_and_state_dict_import(group: optstep.LocalGroup) -> None:
    """Two trainers in REPLICATED gradient mode, each getting every parameter (bf16) from the
    owners; a state dict exported from the owners and imported into a new OWNERS session (each
    master sent to its owner alone) goes on as the REPLICATED session does."""
    with optstep.Client(rank_targets=group.targets, stream_timeout=60) as a, \
            optstep.Client(rank_targets=group.targets, stream_timeout=60) as b:
        owned, owned_state, owned_pull = _trained_and_imported([a, b], pb.PARAMETER_STORAGE_OWNERS)
        reference, reference_state, reference_pull = _trained_and_imported(
            [a, b], pb.PARAMETER_STORAGE_REPLICATED)
    for step, (trainers, expected) in enumerate(zip(owned, reference), start=1):
        for trainer, (params, want) in enumerate(zip(trainers, expected)):
            assert params.keys() == want.keys() == set(range(len(SHAPES))), (step, trainer)
            for pid, value in params.items():
                assert value.tobytes() == want[pid].tobytes(), (step, trainer, pid)
    assert owned_state.keys() == reference_state.keys()
    for key, value in owned_state.items():
        assert np.asarray(value).tobytes() == np.asarray(reference_state[key]).tobytes(), key
    assert owned_pull.params.keys() == reference_pull.params.keys() == set(range(len(SHAPES)))
    for pid, value in owned_pull.params.items():
        assert value.tobytes() == reference_pull.params[pid].tobytes(), pid
