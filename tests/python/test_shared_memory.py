"""Steps through memory shared with the ranks of this host (docs/api.md, "Shared memory"): the
same results, bit for bit, as the streams, over several ranks and both parameter storages, from
Client.step and from RemoteOptimizer; a rank that restarts gets a new segment by itself; and
every misuse of a segment is refused with a precise status, several trainers sum in their order
as through the streams, while a client that cannot share memory falls back to the stream by
itself."""

from __future__ import annotations

import os
import pathlib
import threading
import urllib.request
from typing import Dict, Iterator, List

import grpc
import numpy as np
import pytest
import torch
from torch import nn

import optstep
from optstep import config, pb, shared_memory
from optstep.rank_channels import RankChannel
from optstep.torch import RemoteOptimizer
from optstep.v1 import optimizer_service_pb2 as svc_pb2
from optstep.v1 import optimizer_service_pb2_grpc as svc_grpc

SHAPES = [(64, 33), (17,), (40, 8), (5, 5, 3), (129,)]


def _spec(name: str, storage: int = pb.PARAMETER_STORAGE_REPLICATED,
          mode: int = pb.GRADIENT_MODE_REPLICATED, trainers: int = 1) -> pb.SessionSpec:
    return pb.SessionSpec(name=name, num_trainers=trainers, gradient_mode=mode,
                          parameter_storage=storage,
                          parameters=[pb.ParameterSpec(name=f"w{i}", shape=list(s))
                                      for i, s in enumerate(SHAPES)],
                          optimizer=config.chain(config.adamw(lr=1e-2, weight_decay=0.1)))


def _gradients(step: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {f"w{i}": rng.standard_normal(s, dtype=np.float32) for i, s in enumerate(SHAPES)}


def _shares(client: optstep.Client, session_id: str) -> bool:
    """Whether the client's steps of the session went through shared memory."""
    return any(key[0] == session_id for key in client._shared._segments)  # noqa: SLF001


def _run(client: optstep.Client, spec: pb.SessionSpec, steps: int) -> Dict[int, np.ndarray]:
    info, _ = client.create_session(spec)
    reply = None
    for step in range(1, steps + 1):
        reply = client.step(info.session_id, step, _gradients(step))
        assert reply.step == step
    assert reply is not None
    assert sorted(reply.params) == list(range(len(SHAPES)))
    return reply.params


@pytest.fixture
def group(server_binary: str) -> Iterator[optstep.LocalGroup]:
    with optstep.LocalGroup(3, server_binary) as local:
        yield local


@pytest.mark.parametrize("storage", [pb.PARAMETER_STORAGE_REPLICATED,
                                     pb.PARAMETER_STORAGE_OWNERS])
def test_shared_memory_steps_match_the_streams_bit_for_bit(group: optstep.LocalGroup,
                                                           storage: int) -> None:
    results: List[Dict[int, np.ndarray]] = []
    for shared in (False, True):
        with optstep.Client(rank_targets=group.targets, shared_memory=shared) as client:
            name = f"parity-{storage}-{shared}"
            results.append(_run(client, _spec(name, storage), 4))
            sid = client.create_session(_spec(name, storage))[0].session_id  # attaches
            assert _shares(client, sid) == shared
            pulled = client.pull_parameters(sid).params
        for pid, values in results[-1].items():
            np.testing.assert_array_equal(pulled[pid], values)
    for pid, values in results[0].items():
        np.testing.assert_array_equal(results[1][pid], values)


def test_returned_parameters_are_written_into_the_given_buffers(
        server: optstep.LocalServer) -> None:
    with optstep.Client(server.address, shared_memory=True) as client:
        sid = client.create_session(_spec("into-buffers"))[0].session_id
        outs = {0: np.zeros(SHAPES[0], np.float32), 2: torch.zeros(SHAPES[2])}
        reply = client.step(sid, 1, _gradients(1), return_params=[0, 2, 4], param_out=outs)
        assert _shares(client, sid)
        assert sorted(reply.params) == [4]  # the others went into their buffers
        pulled = client.pull_parameters(sid).params
        np.testing.assert_array_equal(outs[0], pulled[0])
        np.testing.assert_array_equal(outs[2].numpy(), pulled[2])
        np.testing.assert_array_equal(reply.params[4], pulled[4])
        assert client.step(sid, 2, _gradients(2), skip_return=True).params == {}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("overlap", [False, True])
def test_remote_optimizer_through_shared_memory_trains_as_through_the_stream(
        server: optstep.LocalServer, overlap: bool) -> None:
    weights = []
    for shared in (False, True):
        torch.manual_seed(0)
        model = _Net()
        with optstep.Client(server.address, shared_memory=shared) as client:
            opt = RemoteOptimizer(model, client, optimizer=config.chain(config.adamw(lr=1e-2)),
                                  overlap=overlap)
            generator = torch.Generator().manual_seed(1)
            for _ in range(3):
                opt.zero_grad()
                x = torch.randn(8, 12, generator=generator)
                model(x).square().mean().backward()
                opt.step()
            opt.synchronize()
            assert _shares(client, opt.session_id) == shared
            opt.close_session()
        weights.append([p.detach().clone() for p in model.parameters()])
    for stream, shared in zip(*weights):
        assert torch.equal(stream, shared)


def test_a_client_that_cannot_share_memory_uses_the_stream(server_binary: str) -> None:
    with optstep.LocalServer(server_binary, flags=["--shared_memory=false"]) as local:
        with optstep.Client(local.address, shared_memory=True) as client:
            sid = client.create_session(_spec("refused"))[0].session_id
            assert client.step(sid, 1, _gradients(1)).step == 1
            assert not _shares(client, sid)
            stub = svc_grpc.OptimizerServiceStub(grpc.insecure_channel(local.address))
            with pytest.raises(grpc.RpcError) as refused:
                stub.AttachSharedMemory(svc_pb2.AttachSharedMemoryRequest(session_id=sid))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--shared_memory=false" in refused.value.details()


def test_a_segment_that_does_not_fit_the_budget_is_refused(server_binary: str) -> None:
    # The session's footprint fits, a segment beside it (its gradients and values again) not.
    with optstep.LocalServer(server_binary, flags=["--memory_budget=1M"]) as local:
        with optstep.Client(local.address, shared_memory=True) as client:
            spec = pb.SessionSpec(name="big", num_trainers=1,
                                  gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                                  parameters=[pb.ParameterSpec(name="w", shape=[200, 256])],
                                  optimizer=config.chain(config.sgd(lr=0.1)))
            sid = client.create_session(spec)[0].session_id
            stub = svc_grpc.OptimizerServiceStub(grpc.insecure_channel(local.address))
            with pytest.raises(grpc.RpcError) as refused:
                stub.AttachSharedMemory(svc_pb2.AttachSharedMemoryRequest(session_id=sid))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "shared memory of trainer 0" in refused.value.details()
            grads = {"w": np.ones((200, 256), np.float32)}
            assert client.step(sid, 1, grads).step == 1  # through the stream
            assert not _shares(client, sid)


def _attach(stub: svc_grpc.OptimizerServiceStub, sid: str,
            trainer: int = 0) -> svc_pb2.AttachSharedMemoryResponse:
    answer: svc_pb2.AttachSharedMemoryResponse = stub.AttachSharedMemory(
        svc_pb2.AttachSharedMemoryRequest(session_id=sid, trainer_id=trainer))
    return answer


def _step(stub: svc_grpc.OptimizerServiceStub, header: svc_pb2.StepHeader,
          *extra: svc_pb2.StepRequest) -> grpc.RpcError:
    requests = [svc_pb2.StepRequest(header=header), *extra,
                svc_pb2.StepRequest(commit=svc_pb2.StepCommit())]
    with pytest.raises(grpc.RpcError) as failed:
        list(stub.Step(iter(requests), timeout=30))
    return failed.value


def test_misused_segments_are_refused_naming_what_is_wrong(server: optstep.LocalServer) -> None:
    stub = svc_grpc.OptimizerServiceStub(grpc.insecure_channel(server.address))
    with optstep.Client(server.address) as client:
        sid = client.create_session(_spec("misuse", trainers=2))[0].session_id
        other = client.create_session(_spec("misuse-other"))[0].session_id
        sharded = client.create_session(_spec("misuse-sharded",
                                              mode=pb.GRADIENT_MODE_SHARDED))[0].session_id
    mine = _attach(stub, sid, trainer=0)
    assert mine.path.startswith("/proc/") and len(mine.token) == 16
    assert mine.gradients_offset == 64 and mine.bytes == 2 * (mine.parameters_offset - 64) + 64

    with pytest.raises(grpc.RpcError) as e:
        _attach(stub, sid, trainer=2)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "trainer_id 2" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        _attach(stub, sharded)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "SHARDED" in e.value.details()

    def header(session: str, trainer: int, segment: int, **kw: int) -> svc_pb2.StepHeader:
        return svc_pb2.StepHeader(session_id=session, step=1, trainer_id=trainer,
                                  shared_memory_segment=segment, **kw)

    # Another trainer's segment, another session's, one replaced by a second attach.
    error = _step(stub, header(sid, 1, mine.segment_id))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert f"not the segment of trainer 1 of session '{sid}'" in error.details()
    error = _step(stub, header(other, 0, mine.segment_id))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    replaced = _attach(stub, sid, trainer=0)
    error = _step(stub, header(sid, 0, mine.segment_id))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    # A step through a segment carries no chunks, and takes its parameters in fp32.
    chunk = svc_pb2.StepRequest(gradient=pb.TensorChunk(param_id=1, dtype=pb.DTYPE_FP32,
                                                        data=b"\0" * 68))
    error = _step(stub, header(sid, 0, replaced.segment_id), chunk)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gradient chunk of param_id 1 in a step that reads its gradients" in error.details()
    error = _step(stub, header(sid, 0, replaced.segment_id, return_dtype=pb.DTYPE_BF16))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "return_dtype must be FP32" in error.details()
    # Nothing was applied by any of them.
    with optstep.Client(server.address) as client:
        assert client.get_session(sid).step == 0


@pytest.mark.parametrize("target,local", [
    ("localhost:50051", True), ("127.0.0.1:5", True), ("[::1]:5", True),
    ("dns:///localhost:3", True), ("unix:/run/optstep.sock", True), ("ipv4:127.0.0.2:4", True),
    ("optstep-0.optstep:50051", False), ("10.0.0.1:50051", False), ("[2001:db8::1]:1", False)])
def test_segments_are_asked_of_loopback_ranks_only(target: str, local: bool) -> None:
    assert shared_memory.on_loopback(target) == local


def test_two_trainers_sum_in_trainer_order_as_through_the_streams(
        server: optstep.LocalServer) -> None:
    # Trainer 1's gradients wait for trainer 0's on the rank (REPLICATED sums in trainer order):
    # read from its segment a chunk at a time, as streamed chunks are.
    results: List[Dict[int, np.ndarray]] = []
    for shared in (False, True):
        with optstep.Client(server.address, shared_memory=shared) as client:
            sid = client.create_session(_spec(f"two-trainers-{shared}", trainers=2))[0].session_id
            replies: Dict[int, Dict[int, np.ndarray]] = {}

            def trainer(t: int) -> None:
                for step in range(1, 4):
                    grads = {k: v * (t + 1) for k, v in _gradients(10 * step + t).items()}
                    replies[t] = client.step(sid, step, grads, trainer_id=t).params

            threads = [threading.Thread(target=trainer, args=(t,)) for t in (1, 0)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert _shares(client, sid) == shared
            for pid, values in replies[0].items():
                np.testing.assert_array_equal(replies[1][pid], values)
            results.append(replies[0])
    for pid, values in results[0].items():
        np.testing.assert_array_equal(results[1][pid], values)


def _metric(metrics_port_file: pathlib.Path, name: str) -> float:
    port = int(metrics_port_file.read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


def _shared_bytes(metrics_port_file: pathlib.Path) -> float:
    return _metric(metrics_port_file, "optstep_shared_memory_bytes")


def test_a_segment_the_client_cannot_open_or_closes_goes_back_to_the_rank(
        server_binary: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port_file = tmp_path / "metrics_port"
    flags = ["--metrics_port=-1", f"--metrics_port_file={port_file}"]
    with optstep.LocalServer(server_binary, flags=flags) as local:
        with optstep.Client(local.address, shared_memory=True) as client:
            sid = client.create_session(_spec("unopenable"))[0].session_id
            assert client.step(sid, 1, _gradients(1)).step == 1  # attached and used
            assert _shared_bytes(port_file) > 0
            # Counted as the streams' bytes are: every gradient in, every value out.
            step_bytes = 4 * sum(int(np.prod(s)) for s in SHAPES)
            assert _metric(port_file, "optstep_gradient_bytes_received_total") == step_bytes
            assert _metric(port_file, "optstep_parameter_bytes_sent_total") == step_bytes
        # Given back as the client closes, not held until the session closes.
        assert _shared_bytes(port_file) == 0
        real_open = os.open

        def no_proc(path: str, flags: int, *args: int) -> int:
            if str(path).startswith("/proc/"):  # as from another pid namespace
                raise PermissionError(13, "Permission denied", path)
            return real_open(path, flags, *args)

        monkeypatch.setattr(shared_memory.os, "open", no_proc)
        with optstep.Client(local.address, shared_memory=True) as client:
            assert client.step(sid, 2, _gradients(2)).step == 2  # through the stream
            assert not _shares(client, sid)
            assert _shared_bytes(port_file) == 0  # released, not held until the session closes


class _Refused(grpc.RpcError):
    """What a rank that cannot share memory answers an attach."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "shared memory is off on this rank (--shared_memory=false)"


class _RefusingRank:
    """A rank's service that refuses every segment, counting the attaches asked of it."""

    def __init__(self) -> None:
        self.asked = 0

    def AttachSharedMemory(self, request: svc_pb2.AttachSharedMemoryRequest,  # noqa: N802
                           timeout: float = 0.0) -> svc_pb2.AttachSharedMemoryResponse:
        self.asked += not request.release
        raise _Refused()


def test_segments_attached_before_a_rank_refuses_go_back(
        server_binary: str, tmp_path: pathlib.Path) -> None:
    """A session whose later rank refuses shared memory steps through the streams: the segments
    that the ranks before it attached go back to them at once, rather than counting against their
    budgets until the session closes."""
    port_file = tmp_path / "metrics_port"
    flags = ["--metrics_port=-1", f"--metrics_port_file={port_file}"]
    with optstep.LocalServer(server_binary, flags=flags) as local:
        with optstep.Client(local.address, shared_memory=True) as client:
            sid = client.create_session(_spec("refused-later"))[0].session_id
            layout = client.layout(sid)
            with grpc.insecure_channel(local.address) as channel:
                ranks = [svc_grpc.OptimizerServiceStub(channel), _RefusingRank()]
                assert client._shared.get(layout, 0, ranks, 10.0) is None  # noqa: SLF001
            assert _shared_bytes(port_file) == 0


def test_a_refusal_holds_while_the_same_targets_serve_the_session(
        server: optstep.LocalServer) -> None:
    """A session refused shared memory by one of its ranks (a stand-in over its share of its
    host's budget) is not asked again while the same targets serve it, and is asked again once
    they change (the rank's own process back at its address): its steps get the fast path
    back."""
    with optstep.Client(server.address, shared_memory=True) as client:
        sid = client.create_session(_spec("refused-then-back"))[0].session_id
        ranks = client._ranks  # noqa: SLF001
        stand_in_target = f"localhost:{server.address.rsplit(':', 1)[1]}"
        ranks.follow([stand_in_target], [0])
        stand_in = _RefusingRank()
        with grpc.insecure_channel(stand_in_target) as channel:
            ranks._stand_ins[0] = RankChannel(stand_in_target, channel, stand_in,  # noqa: SLF001
                                              None)
            assert not client._shares_memory(sid, 0)  # noqa: SLF001
            assert not client._shares_memory(sid, 0)  # noqa: SLF001
            assert stand_in.asked == 1
        ranks.follow([server.address], [])  # rank 0's own process is back
        assert client._shares_memory(sid, 0)  # noqa: SLF001
        assert client.step(sid, 1, _gradients(1)).step == 1
        assert _shares(client, sid)


def test_a_rank_away_when_a_segment_is_attached_is_unavailable(server: optstep.LocalServer) -> None:
    """A rank that does not answer while the client attaches its segment (it restarted, or its
    stand-in gave way) is UNAVAILABLE as for any other call, which the step's recovery waits out,
    rather than a raw gRPC error that ends the training loop."""
    with optstep.Client(server.address, shared_memory=True) as client:
        sid = client.create_session(_spec("away"))[0].session_id
        layout = client.layout(sid)
        with grpc.insecure_channel("127.0.0.1:1") as nowhere:  # nothing listens there
            stubs = [svc_grpc.OptimizerServiceStub(nowhere)]
            with pytest.raises(optstep.UnavailableError):
                client._shared.get(layout, 0, stubs, 1.0)  # noqa: SLF001


@pytest.mark.parametrize("away", [optstep.CancelledError("the server is shutting down"),
                                  optstep.DeadlineExceededError("no answer in time")])
def test_a_step_whose_attach_finds_a_rank_stopping_or_wedged_goes_through_the_stream(
        server: optstep.LocalServer, monkeypatch: pytest.MonkeyPatch,
        away: optstep.OptstepError) -> None:
    """An attach that a stopping rank cancels, or that a wedged one does not answer, is a rank
    away, as UNAVAILABLE is: the step goes through the stream, whose recovery waits for the
    group, and a later step attaches. Before, the step failed at once."""
    with optstep.Client(server.address, shared_memory=True) as client:
        sid = client.create_session(_spec(f"away-{away.code.name}"))[0].session_id

        def unreachable(*args: object, **kwargs: object) -> None:
            raise away

        with monkeypatch.context() as patched:
            patched.setattr(client._shared, "get", unreachable)  # noqa: SLF001
            assert client.step(sid, 1, _gradients(1)).step == 1
        assert not _shares(client, sid)
        assert client.step(sid, 2, _gradients(2)).step == 2
        assert _shares(client, sid)
