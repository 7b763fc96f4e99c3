"""Errors surface as OptstepError subclasses carrying the gRPC code and the server's message."""

from __future__ import annotations

from typing import NamedTuple

import grpc
import numpy as np
import pytest

import optstep
from optstep import config, pb
from optstep.errors import EXPECTED_STEP_PAYLOAD
from optstep.v1 import optimizer_service_pb2 as svc_pb2


def _session(client: optstep.Client, **spec_fields) -> str:
    spec = pb.SessionSpec(num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name="w", shape=[2, 3])],
                          optimizer=config.chain(config.sgd(lr=0.1)))
    for key, value in spec_fields.items():
        if key == "optimizer":
            spec.optimizer.CopyFrom(value)
        else:
            setattr(spec, key, value)
    info, _ = client.create_session(spec)
    return info.session_id


def test_unknown_session_is_not_found(client: optstep.Client) -> None:
    with pytest.raises(optstep.NotFoundError) as raised:
        client.get_session("no-such-session")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert "no-such-session" in raised.value.message
    with pytest.raises(optstep.NotFoundError):
        client.step("no-such-session", 1, {0: np.zeros(6, np.float32)})


def test_gradient_of_the_wrong_shape(client: optstep.Client) -> None:
    """Found by the client before anything is sent, with the code the server would give."""
    sid = _session(client)
    with pytest.raises(optstep.InvalidArgumentError) as raised:
        client.step(sid, 1, {"w": np.zeros((3, 2), np.float32)})
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "param 'w'" in raised.value.message and "[3, 2]" in raised.value.message
    assert isinstance(raised.value, ValueError)
    with pytest.raises(optstep.InvalidArgumentError, match=r"range \[4, 8\) exceeds"):
        client.step(sid, 1, [optstep.GradientSlice("w", np.zeros(4, np.float32), offset=4)])
    with pytest.raises(optstep.NotFoundError, match="param 'v' not found"):
        client.step(sid, 1, {"v": np.zeros(6, np.float32)})
    with pytest.raises(optstep.InvalidArgumentError, match="int64"):
        client.step(sid, 1, {"w": np.zeros((2, 3), np.int64)})


def test_server_side_invalid_argument(client: optstep.Client) -> None:
    """Shapes and optimizer kinds are checked by the server; its code and message come back."""
    bad_shape = pb.SessionSpec(num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                               parameters=[pb.ParameterSpec(name="w", shape=[2, 0])],
                               optimizer=config.chain(config.sgd(lr=0.1)))
    with pytest.raises(optstep.InvalidArgumentError) as raised:
        client.create_session(bad_shape)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'w'" in raised.value.message
    unknown = pb.OptimizerConfig(sub_optimizers=[pb.SubOptimizer(name="x", kind="nadam")])
    with pytest.raises(optstep.InvalidArgumentError, match="nadam"):
        _session(client, optimizer=unknown)


def test_incomplete_gradient_is_refused_at_commit(client: optstep.Client) -> None:
    """Coverage is checked by the server: half a gradient in REPLICATED mode."""
    sid = _session(client)
    with pytest.raises(optstep.InvalidArgumentError) as raised:
        client.step(sid, 1, [optstep.GradientSlice("w", np.ones(3, np.float32))])
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_step_out_of_sequence_and_late_initial_values(client: optstep.Client) -> None:
    sid = _session(client)
    with pytest.raises(optstep.FailedPreconditionError, match="1") as out_of_sequence:
        client.step(sid, 2, {"w": np.ones(6, np.float32)})
    # The step the session expects crosses gRPC as a payload, for the clients' recovery.
    assert out_of_sequence.value.payload_number(EXPECTED_STEP_PAYLOAD) == 1
    client.step(sid, 1, {"w": np.ones(6, np.float32)})
    with pytest.raises(optstep.FailedPreconditionError) as raised:
        client.init_parameters(sid, {"w": np.ones(6, np.float32)})
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(optstep.UnavailableError) as raised:
        optstep.Client("127.0.0.1:1", connect_timeout=0.2)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    lazy = optstep.Client("127.0.0.1:1", connect_timeout=0, rpc_timeout=1)
    with pytest.raises(optstep.UnavailableError):
        lazy.list_sessions()
    lazy.close()


def test_bad_client_options() -> None:
    with pytest.raises(optstep.InvalidArgumentError, match="max_chunk_bytes"):
        optstep.Client("localhost:1", max_chunk_bytes=8 << 20, connect_timeout=0)
    with pytest.raises(optstep.InvalidArgumentError, match="no target"):
        optstep.Client(connect_timeout=0)


def test_a_replay_is_answered_only_for_the_same_gradient(server: optstep.LocalServer,
                                                         client: optstep.Client) -> None:
    sid = _session(client)
    applied = client.step(sid, 1, {"w": np.arange(6, dtype=np.float32)})
    # The same gradient sent again in 12-byte chunks is a replay of step 1.
    with optstep.Client(server.address, max_chunk_bytes=12) as small_chunks:
        replayed = small_chunks.step(sid, 1, {"w": np.arange(6, dtype=np.float32)})
    assert replayed.step == 1 and replayed.grad_norm == applied.grad_norm
    # Another gradient for step 1 is not answered with step 1's result.
    with pytest.raises(optstep.FailedPreconditionError) as raised:
        client.step(sid, 1, {"w": np.ones(6, np.float32)})
    assert (f"step 1 of session '{sid}' was already applied with a different contribution "
            "from trainer 0") in raised.value.message
    assert raised.value.payload_number(EXPECTED_STEP_PAYLOAD) is None
    assert client.get_session(sid).step == 1


class _Metadatum(NamedTuple):
    key: str
    value: bytes


class _FakeRpcError(grpc.RpcError):
    """An error as a call raises it, with status details in its trailers."""

    def __init__(self, details: bytes) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "step 5 out of sequence"

    def trailing_metadata(self) -> tuple:
        return (_Metadatum("grpc-status-details-bin", self._details),)


def test_status_details_carry_only_what_a_server_sends() -> None:
    """Garbage is ignored, and so are payloads a server does not send (a rewind, which only the
    client's own recovery may tell) and oversized ones."""
    assert optstep.errors.from_rpc_error(_FakeRpcError(b"\xff\xff garbage")).payloads == {}
    details = svc_pb2.StatusDetails()
    details.payloads.add(type_url="type.optstep.dev/optstep.RewindStep", value=b"2")
    details.payloads.add(type_url=EXPECTED_STEP_PAYLOAD, value=b"1" * 257)
    error = optstep.errors.from_rpc_error(_FakeRpcError(details.SerializeToString()))
    assert isinstance(error, optstep.FailedPreconditionError)
    assert error.payloads == {}
    details.payloads[1].value = b"6"
    error = optstep.errors.from_rpc_error(_FakeRpcError(details.SerializeToString()))
    assert error.payload_number(EXPECTED_STEP_PAYLOAD) == 6


@pytest.mark.parametrize("path", ["native", "python"])
def test_the_expected_step_crosses_both_data_paths(server: optstep.LocalServer,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   path: str) -> None:
    """The step a refusal expects reaches the caller through the native library and through the
    pure-Python stream alike."""
    monkeypatch.setenv("OPTSTEP_NATIVE", "0" if path == "python" else "1")
    with optstep.Client(server.address) as client:
        sid = _session(client)
        with pytest.raises(optstep.FailedPreconditionError) as refused:
            client.step(sid, 3, {"w": np.ones(6, np.float32)})
        assert refused.value.payload_number(EXPECTED_STEP_PAYLOAD) == 1
