"""The native data path of Client.step (optstep.native, liboptstep_native.so) against the
pure-Python one: the same steps through both give bit-identical parameters, the same errors,
and the native path writes the returned parameters straight into the caller's buffers."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

import optstep
from optstep import config, dtypes, native, pb
from optstep.torch import RemoteOptimizer
from repository import native_library_path
from support import make_data, make_mlp, train

PATHS = ["native", "python"]
EXCHANGE_STEPS = optstep.client.exchange_steps


@pytest.fixture(autouse=True)
def library(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library is loaded once per process: from the package when bazel/python_env.sh copied
    it there, else from bazel-bin (built when missing)."""
    if not native.library_path().is_file():
        monkeypatch.setenv("OPTSTEP_NATIVE_LIB", native_library_path())


def use_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Selects the data path; with the native one, the pure-Python step must not run."""
    monkeypatch.setenv("OPTSTEP_NATIVE", "1" if path == "native" else "0")
    assert native.available() == (path == "native")

    def no_python_path(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the pure-Python step path ran with the native library on")

    monkeypatch.setattr(optstep.client, "exchange_steps",
                        no_python_path if path == "native" else EXCHANGE_STEPS)


def _spec(optimizer: pb.OptimizerConfig) -> pb.SessionSpec:
    return pb.SessionSpec(num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name="w", shape=[64, 33]),
                                      pb.ParameterSpec(name="b", shape=[33])],
                          optimizer=optimizer)


def _gradients(step: int) -> List[Dict[str, Any]]:
    """One step's gradients in every dtype and form the client takes."""
    rng = np.random.default_rng(step)
    w = rng.standard_normal((64, 33), dtype=np.float32)
    b = rng.standard_normal(33, dtype=np.float32)
    return [
        {"w": w, "b": b},
        {"w": torch.from_numpy(w).to(torch.bfloat16), "b": torch.from_numpy(b).half()},
        {"w": w.astype(np.float16), "b": torch.from_numpy(b)},
        [optstep.GradientSlice("w", w.reshape(-1)[:1000], 0, "bf16"),
         optstep.GradientSlice("w", w.reshape(-1)[1000:], 1000),
         optstep.GradientSlice(1, dtypes.bf16_bits_from_fp32(b), dtype="bf16")],
    ][step % 4]


def _run(client: optstep.Client, return_dtype: str, steps: int) -> List[Dict[int, np.ndarray]]:
    info, _ = client.create_session(_spec(config.chain(config.adamw(lr=1e-2,
                                                                    weight_decay=0.1))))
    rng = np.random.default_rng(7)
    client.init_parameters(info.session_id,
                           {"w": rng.standard_normal((64, 33), dtype=np.float32),
                            "b": np.zeros(33, np.float32)})
    replies = []
    for k in range(steps):
        reply = client.step(info.session_id, k + 1, _gradients(k), return_dtype=return_dtype)
        assert reply.step == k + 1 and not reply.skipped and reply.grad_norm > 0
        replies.append(reply.params)
    client.close_session(info.session_id)
    return replies


@pytest.mark.parametrize("return_dtype", ["fp32", "bf16"])
def test_both_paths_give_identical_parameters(client: optstep.Client,
                                              monkeypatch: pytest.MonkeyPatch,
                                              return_dtype: str) -> None:
    results = {}
    for path in PATHS:
        use_path(monkeypatch, path)
        results[path] = _run(client, return_dtype, steps=5)
    for native_params, python_params in zip(results["native"], results["python"]):
        assert list(native_params) == list(python_params) == [0, 1]
        for pid in python_params:
            assert native_params[pid].dtype == python_params[pid].dtype
            assert native_params[pid].shape == python_params[pid].shape
            np.testing.assert_array_equal(native_params[pid], python_params[pid])


@pytest.mark.parametrize("path", PATHS)
def test_param_out_is_written_in_place(client: optstep.Client, monkeypatch: pytest.MonkeyPatch,
                                       path: str) -> None:
    """Buffers given in param_out take the values; the other parameters come back as usual."""
    use_path(monkeypatch, path)
    info, _ = client.create_session(_spec(config.chain(config.sgd(lr=0.5), clip_grad=0)))
    sid = info.session_id
    client.init_parameters(sid, {"w": np.ones((64, 33), np.float32),
                                 "b": np.zeros(33, np.float32)})
    w = torch.zeros(64, 33)
    reply = client.step(sid, 1, {"w": np.ones((64, 33), np.float32),
                                 "b": np.ones(33, np.float32)}, param_out={0: w})
    assert list(reply.params) == [1]
    torch.testing.assert_close(w, torch.full((64, 33), 0.5), rtol=0, atol=0)
    np.testing.assert_array_equal(reply.params[1], np.full(33, -0.5, np.float32))
    b_bits = np.zeros(33, np.uint16)
    reply = client.step(sid, 2, {"w": np.ones((64, 33), np.float32),
                                 "b": np.ones(33, np.float32)},
                        return_dtype="bf16", param_out={1: b_bits})
    assert list(reply.params) == [0]
    np.testing.assert_array_equal(dtypes.fp32_from_bf16_bits(b_bits), np.full(33, -1.0))
    with pytest.raises(optstep.InvalidArgumentError, match="output buffer"):
        native.out_buffer(torch.zeros(64, 33, dtype=torch.float16), dtypes.FP32, 64 * 33, "w")
    client.close_session(sid)


@pytest.mark.parametrize("path", PATHS)
def test_a_param_out_that_does_not_fit_is_refused_before_anything_is_sent(
        client: optstep.Client, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """A buffer that cannot take its parameter (not contiguous, of another dtype, an unknown id)
    is InvalidArgumentError before the step is sent, on every path. Before, the pure-Python path
    wrote into a copy of a strided buffer or the bf16 bits as floats, silently, after the step
    was applied."""
    use_path(monkeypatch, path)
    info, _ = client.create_session(_spec(config.chain(config.sgd(lr=0.5), clip_grad=0)))
    sid = info.session_id
    client.init_parameters(sid, {"w": np.ones((64, 33), np.float32),
                                 "b": np.zeros(33, np.float32)})
    grads = {"w": np.ones((64, 33), np.float32), "b": np.ones(33, np.float32)}
    for out, dtype in [({0: np.zeros((33, 64), np.float32).T}, "fp32"),
                       ({1: np.zeros(33, np.float32)}, "bf16"),
                       ({7: np.zeros(33, np.float32)}, "fp32")]:
        with pytest.raises(optstep.InvalidArgumentError, match="param_id 7|output buffer"):
            client.step(sid, 1, grads, return_dtype=dtype, param_out=out)
    assert client.step(sid, 1, grads).step == 1  # nothing of the refused ones was applied
    client.close_session(sid)


@pytest.mark.parametrize("path", PATHS)
def test_errors_are_the_same(client: optstep.Client, monkeypatch: pytest.MonkeyPatch,
                             path: str) -> None:
    use_path(monkeypatch, path)
    info, _ = client.create_session(_spec(config.chain(config.sgd(lr=0.5))))
    sid = info.session_id
    client.init_parameters(sid, {"w": np.ones((64, 33), np.float32),
                                 "b": np.zeros(33, np.float32)})
    with pytest.raises(optstep.InvalidArgumentError, match="exceeds"):
        client.step(sid, 1, [optstep.GradientSlice("b", np.ones(4, np.float32), 30)])
    with pytest.raises(optstep.NotFoundError):
        client.step(sid, 1, [optstep.GradientSlice("nope", np.ones(4, np.float32))])
    with pytest.raises(optstep.FailedPreconditionError):
        client.step(sid, 3, {"w": np.ones((64, 33), np.float32), "b": np.ones(33, np.float32)})
    client.close_session(sid)


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_remote_optimizer_identical_on_both_paths(client: optstep.Client,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  model_dtype: torch.dtype) -> None:
    """The model's own tensors are written by the native path; the result is bit-identical."""
    x, y = make_data(5)
    start = make_mlp(4).to(model_dtype)
    models = {}
    for path in PATHS:
        use_path(monkeypatch, path)
        model = copy.deepcopy(start)
        opt = RemoteOptimizer(model, client, optimizer=config.chain(config.adamw(lr=1e-2)))
        train(model, opt, x.to(model_dtype), y, steps=4)
        assert opt.next_step == 5
        opt.close_session()
        models[path] = model
    for (name, a), b in zip(models["native"].named_parameters(), models["python"].parameters()):
        assert torch.equal(a, b), f"param '{name}' differs between the paths"
        assert not torch.equal(a, dict(start.named_parameters())[name]), name


def test_a_client_closed_while_a_step_is_open_keeps_its_native_client_until_the_step_ends(
        server: optstep.LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client closed while a step of it is still open (the overlap thread's, another trainer
    thread's) frees the C++ client only once that step let go of it. Before, close() freed it
    under the step, whose stream then called into freed memory; and a closed client still
    opened channels and native clients for its later calls."""
    use_path(monkeypatch, "native")
    client = optstep.Client(server.address, shared_memory=False)
    info, _ = client.create_session(_spec(config.chain(config.sgd(lr=0.5), clip_grad=0)))
    sid = info.session_id
    client.init_parameters(sid, {"w": np.ones((64, 33), np.float32),
                                 "b": np.zeros(33, np.float32)})
    opened = client.open_step(sid, 1)
    opened.add({"w": np.ones((64, 33), np.float32), "b": np.ones(33, np.float32)})
    closer = optstep.Client(server.address)
    client.close()
    reply = opened.finish()
    opened.close()
    assert reply.step == 1
    np.testing.assert_array_equal(reply.params[1], np.full(33, -0.5, np.float32))
    with pytest.raises(optstep.FailedPreconditionError, match="closed"):
        client.step(sid, 2, {"w": np.ones((64, 33), np.float32), "b": np.ones(33, np.float32)})
    closer.close_session(sid)
    closer.close()


def test_an_open_step_that_fails_before_it_starts_keeps_no_use_of_the_native_client(
        server: optstep.LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step stream whose arguments fail to convert (a learning rate that is no number) gives
    back its use of the C++ client: the client is freed at close, not kept for good."""
    use_path(monkeypatch, "native")
    with optstep.Client(server.address, shared_memory=False) as client:
        info, _ = client.create_session(_spec(config.chain(config.sgd(lr=0.5))))
        native_client = client._native_client(info.session_id)  # noqa: SLF001
        assert native_client is not None
        with pytest.raises(TypeError):
            native_client.open_step(info.session_id, 1, 0, [(0, "fast", None)], 0, [], False)
        assert native_client._users == 0  # noqa: SLF001
        client.close_session(info.session_id)
