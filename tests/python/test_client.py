"""optstep.Client against the real server: sessions, dtypes, chunking, pull, health."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import optstep
from optstep import config, dtypes, pb


def _spec(name: str = "", trainers: int = 1,
          mode: int = pb.GRADIENT_MODE_REPLICATED) -> pb.SessionSpec:
    return pb.SessionSpec(name=name, num_trainers=trainers, gradient_mode=mode,
                          parameters=[pb.ParameterSpec(name="w", shape=[3, 4]),
                                      pb.ParameterSpec(name="b", shape=[4])],
                          optimizer=config.chain(config.sgd(lr=0.5), clip_grad=0))


def test_session_lifecycle(client: optstep.Client) -> None:
    info, attached = client.create_session(_spec("lifecycle"))
    assert not attached and info.step == 0
    again, attached = client.create_session(_spec("lifecycle"))
    assert attached and again.session_id == info.session_id
    assert info.session_id in [s.session_id for s in client.list_sessions()]
    layout = client.layout(info.session_id)
    assert layout.world_size == 1
    assert [(p.name, p.shape, p.numel, p.owner) for p in layout.params] == [
        ("w", (3, 4), 12, 0), ("b", (4,), 4, 0)]
    client.close_session(info.session_id)
    with pytest.raises(optstep.NotFoundError):
        client.get_session(info.session_id)


def test_health(client: optstep.Client) -> None:
    assert client.check_health()


def test_shutdown_stops_the_rank(server_binary: str) -> None:
    # A rank of its own: the shared one must keep serving.
    with optstep.LocalServer(server_binary) as local:
        with optstep.Client(local.address) as admin:
            with pytest.raises(optstep.OutOfRangeError, match="rank 1 is not one of the 1"):
                admin.shutdown(rank=1)
            admin.shutdown(reason="python test")
        assert local.wait(timeout=30) == 0
        assert "python test" in local.log()


def test_step_with_every_gradient_dtype(client: optstep.Client) -> None:
    """fp32, fp16 and bf16 (numpy bits, torch tensors) gradients; exact with these values."""
    info, _ = client.create_session(_spec())
    sid = info.session_id
    w0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    client.init_parameters(sid, {"w": w0, "b": np.zeros(4, np.float32)})
    grads = [
        {"w": np.full((3, 4), 1.0, np.float32), "b": np.ones(4, np.float16)},
        {"w": torch.full((3, 4), 2.0, dtype=torch.bfloat16), "b": torch.ones(4)},
        [optstep.GradientSlice("w", np.full(12, 0.5, np.float32), dtype="bf16"),
         optstep.GradientSlice(1, dtypes.bf16_bits_from_fp32(np.ones(4, np.float32)),
                               dtype="bf16")],
    ]
    expected_w = w0.copy()
    for k, grad in enumerate(grads):
        reply = client.step(sid, k + 1, grad)
        expected_w -= 0.5 * {0: 1.0, 1: 2.0, 2: 0.5}[k]
        assert reply.step == k + 1 and not reply.skipped
        np.testing.assert_array_equal(reply.params[0], expected_w)
        np.testing.assert_array_equal(reply.params[1], np.full(4, -0.5 * (k + 1), np.float32))
    pulled = client.pull_parameters(sid, "bf16", params=["b"])
    assert pulled.step == 3 and list(pulled.params) == [1]
    np.testing.assert_array_equal(dtypes.fp32_from_bf16_bits(pulled.params[1]),
                                  np.full(4, -1.5, np.float32))


def test_small_chunks_and_partial_return(server: optstep.LocalServer) -> None:
    """A 4-byte chunk limit splits every tensor into single elements; return_params picks."""
    with optstep.Client(server.address, max_chunk_bytes=4) as small:
        info, _ = small.create_session(_spec())
        sid = info.session_id
        small.init_parameters(sid, {"w": np.ones((3, 4), np.float32), "b": np.ones(4)})
        reply = small.step(sid, 1, {"w": np.ones((3, 4), np.float32),
                                    "b": np.ones(4, np.float32)}, return_params=["b"])
        assert list(reply.params) == [1]
        np.testing.assert_array_equal(reply.params[1], np.full(4, 0.5, np.float32))
        reply = small.step(sid, 2, {"w": np.ones((3, 4), np.float32),
                                    "b": np.ones(4, np.float32)}, skip_return=True)
        assert reply.params == {} and reply.step == 2


def test_sharded_slices_from_two_trainers_in_threads(client: optstep.Client) -> None:
    """SHARDED: each trainer sends half of every gradient; both get the same parameters."""
    import threading

    info, _ = client.create_session(_spec("sharded-threads", 2, pb.GRADIENT_MODE_SHARDED))
    grad = {"w": np.arange(12, dtype=np.float32), "b": np.arange(4, dtype=np.float32)}
    replies = {}

    def trainer(t: int) -> None:
        slices = [optstep.GradientSlice(name, g[t * g.size // 2:(t + 1) * g.size // 2],
                                        offset=t * g.size // 2) for name, g in grad.items()]
        replies[t] = client.step(info.session_id, 1, slices, trainer_id=t)

    threads = [threading.Thread(target=trainer, args=(t,)) for t in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t in range(2):
        np.testing.assert_array_equal(replies[t].params[0], -0.5 * grad["w"].reshape(3, 4))


def test_non_finite_gradient_skips_the_step(client: optstep.Client) -> None:
    info, _ = client.create_session(_spec())
    sid = info.session_id
    reply = client.step(sid, 1, {"w": np.full((3, 4), np.nan, np.float32),
                                 "b": np.ones(4, np.float32)})
    assert reply.skipped and reply.grad_norm == 0
    reply = client.step(sid, 2, {"w": np.ones((3, 4), np.float32), "b": np.ones(4, np.float32)})
    assert not reply.skipped
    np.testing.assert_array_equal(reply.params[0], np.full((3, 4), -0.5, np.float32))


def test_bf16_rounding_is_nearest_even() -> None:
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, 3.4e38], np.float32)
    bits = dtypes.bf16_bits_from_fp32(values)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(bits, expected.view(np.uint16))
    assert np.isnan(dtypes.fp32_from_bf16_bits(dtypes.bf16_bits_from_fp32(
        np.array([np.nan], np.float32))))[0]
