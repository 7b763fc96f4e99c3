"""Checkpoint and state dict operations that meet each other on one session run one after the
other: the trainers of a data-parallel job all load the same optimizer state dict at start-up,
and a trainer's state_dict() may come while an automatic checkpoint holds the session."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Any, Dict, List

import grpc
import torch

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from repository import REPOSITORY_ROOT
from support import make_data, make_mlp, train

_HOLDER_TOKEN = 0x5EED


def _internal_messages(out: pathlib.Path) -> ModuleType:
    """optstep/v1/internal.proto's messages (the ranks' PeerService), compiled for this test:
    the Python package ships only the public services. (protoc runs in a process of its own:
    grpc_tools' compiler and the native client's protobuf library do not share a process.)"""
    subprocess.run([sys.executable, "-c", "import pathlib, sys; from grpc_tools import protoc; "
                    "include = pathlib.Path(protoc.__file__).parent / '_proto'; "
                    "sys.exit(protoc.main(['protoc', f'-I{include}', *sys.argv[1:]]))",
                    f"-I{REPOSITORY_ROOT / 'proto'}", f"--python_out={out}",
                    "optstep/v1/internal.proto"], check=True)
    spec = importlib.util.spec_from_file_location("optstep_internal_pb2",
                                                  out / "optstep" / "v1" / "internal_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _peer_call(channel: grpc.Channel, messages: ModuleType, method: str, **fields: Any) -> Any:
    call = channel.unary_unary(f"/optstep.v1.PeerService/{method}",
                               request_serializer=messages.HeldSessionRequest.SerializeToString,
                               response_deserializer=messages.HeldSessionResponse.FromString)
    return call(messages.HeldSessionRequest(**fields), timeout=10)


def test_a_state_dict_export_waits_for_the_hold_in_progress(server: optstep.LocalServer,
                                                            client: optstep.Client,
                                                            tmp_path: pathlib.Path) -> None:
    """Another operation holds the session (as an automatic checkpoint does while it copies the
    state): the export waits for its release instead of failing, and then answers."""
    model, (x, y) = make_mlp(40), make_data(41)
    opt = RemoteOptimizer(model, client, optimizer=config.chain(config.adamw(lr=1e-2)))
    train(model, opt, x, y, 2)
    messages = _internal_messages(tmp_path)
    with grpc.insecure_channel(server.address) as channel:
        _peer_call(channel, messages, "HoldSession", session_id=opt.session_id,
                   token=_HOLDER_TOKEN, lease_ms=30_000)
        exported: Dict[str, Any] = {}
        export = threading.Thread(target=lambda: exported.update(opt.state_dict()))
        export.start()
        export.join(timeout=0.5)
        assert export.is_alive(), "the export did not wait for the hold"
        _peer_call(channel, messages, "ReleaseSession", session_id=opt.session_id,
                   token=_HOLDER_TOKEN)
        export.join(timeout=30)
    assert not export.is_alive()
    assert exported["step"] == 2
    assert any(key.endswith("/exp_avg") for key in exported["state"])


def test_trainers_loading_one_state_dict_at_once_all_succeed(client: optstep.Client) -> None:
    """Every trainer of a REPLICATED session loads the same state dict at once, as the workers of
    a data-parallel job do on resume: each import runs in turn, and all end with its values."""
    model, (x, y) = make_mlp(42), make_data(43)
    adamw = config.chain(config.adamw(lr=1e-2))
    saved_opt = RemoteOptimizer(model, client, optimizer=adamw)
    train(model, saved_opt, x, y, 3)
    saved = saved_opt.state_dict()

    trainers = 4
    models = [make_mlp(44) for _ in range(trainers)]
    name = f"held-{time.monotonic_ns()}"
    opts = [RemoteOptimizer(m, client, optimizer=adamw, session_name=name, trainer_id=t,
                            num_trainers=trainers, gradient_mode="replicated")
            for t, m in enumerate(models)]
    errors: List[BaseException] = []

    def load(opt: RemoteOptimizer) -> None:
        try:
            opt.load_state_dict(saved)
        except BaseException as e:  # noqa: B036 - reported below
            errors.append(e)

    threads = [threading.Thread(target=load, args=(opt,)) for opt in opts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for m in models:
        for a, b in zip(m.parameters(), model.parameters()):
            assert torch.equal(a, b)
