"""Routing over several ranks and state-dict streaming, against in-process fake ranks that
record what they receive (the real server is one rank; these check the client's side of the
multi-rank protocol of client/cpp/client.cc)."""

from __future__ import annotations

import threading
import time
import zlib
from concurrent import futures
from typing import Callable, Iterator, List, Optional

import grpc
import numpy as np
import pytest

import optstep
from optstep import pb
from optstep.v1 import (checkpoint_service_pb2 as ckpt, checkpoint_service_pb2_grpc as ckpt_grpc,
                        optimizer_service_pb2 as svc, optimizer_service_pb2_grpc as svc_grpc)

SHAPES = {"a": [2, 3], "b": [4], "c": [5]}
OWNERS = [0, 1, 1]


def _session_info(targets: List[str]) -> pb.SessionInfo:
    info = pb.SessionInfo(session_id="fake", spec=pb.SessionSpec(
        num_trainers=2, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
        parameters=[pb.ParameterSpec(name=n, shape=s) for n, s in SHAPES.items()]))
    info.layout.world_size = len(targets)
    info.layout.owner.extend(OWNERS)
    if "rank_targets" in pb.Layout.DESCRIPTOR.fields_by_name:
        info.layout.rank_targets.extend(targets)
    return info


class FakeRank(svc_grpc.OptimizerServiceServicer, ckpt_grpc.CheckpointServiceServicer):
    """Answers with the session above; records Step and InitParameters streams; its returned
    parameters are filled with 100·rank + param id."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.target = ""
        self.info = pb.SessionInfo()
        self.steps: List[List[svc.StepRequest]] = []
        self.inits: List[List[svc.InitParametersRequest]] = []
        self.imports: List[ckpt.StateDictChunk] = []
        self.import_end = ckpt.StateDictChunk()
        self.abort_steps = False
        self.cancel_steps = False  # its server cancels each Step stream (as when it stops)
        self.cancel_gets = False  # its server cancels each GetSession (as when it stops)
        # Set: Step answers only once this is set (or the call ends), as a rank whose step waits
        # in the collectives for another rank.
        self.hold_steps: threading.Event | None = None
        self.creates: List[svc.CreateSessionRequest] = []
        self.lose_creates = False  # CreateSession takes the request, then its answer is lost
        self.after_create: Optional[Callable[[], None]] = None  # called as it takes one
        self.attach = False  # CreateSession answers an existing session (attached)
        self.refuse_inits = ""  # set: InitParameters ends FAILED_PRECONDITION with this
        self.unavailable_inits = 0  # InitParameters ends UNAVAILABLE this many times first
        # Set: ListSessions tells where the ranks are served (else UNIMPLEMENTED, as before).
        self.directory: svc.ListSessionsResponse | None = None
        # grpc.health.v1 answers SERVING after this many seconds (a wedged rank: longer than the
        # client's rpc_timeout).
        self.health_delay = 0.0

    def health_check(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(self.health_delay)
        return b"\x08\x01"  # HealthCheckResponse(status=SERVING)

    def CreateSession(self, request, context):
        self.creates.append(request)
        if self.after_create is not None:
            self.after_create()
        if self.lose_creates:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"rank {self.rank}: connection reset")
        return svc.CreateSessionResponse(summary=pb.SessionSummary(session_id="fake"),
                                         attached=self.attach)

    def ListSessions(self, request, context):
        if self.directory is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no directory")
        return self.directory

    def GetSession(self, request, context):
        if self.cancel_gets:
            context.abort(grpc.StatusCode.CANCELLED, "the server is shutting down")
        return self.info

    def InitParameters(self, request_iterator, context):
        requests = list(request_iterator)
        self.inits.append(requests)
        if self.refuse_inits:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refuse_inits)
        if self.unavailable_inits > 0:
            self.unavailable_inits -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "the group heals; nothing was written")
        return svc.InitParametersResponse(elements=sum(len(r.values.data) // 4 for r in requests))

    def Step(self, request_iterator, context) -> Iterator[svc.StepResponse]:
        requests = list(request_iterator)
        self.steps.append(requests)
        if self.abort_steps:
            context.abort(grpc.StatusCode.ABORTED, f"rank {self.rank}: step aborted, redo it")
        if self.cancel_steps:
            context.cancel()
            return
        while self.hold_steps is not None and not self.hold_steps.wait(0.05):
            if not context.is_active():
                return
        header = requests[0].header
        # As a server does: with return_owned, the parameters this rank owns; without, all.
        chunks = [] if header.skip_return else [
            pb.TensorChunk(param_id=i, offset=0, dtype=pb.DTYPE_FP32,
                           data=np.full(int(np.prod(s)), 100 * self.rank + i,
                                        np.float32).tobytes())
            for i, s in enumerate(SHAPES.values())
            if not header.return_owned or OWNERS[i] == self.rank]
        yield svc.StepResponse(result=pb.StepResult(step=header.step, grad_norm=1.5,
                                                    params_to_follow=len(chunks)))
        for chunk in chunks:
            yield svc.StepResponse(parameter=chunk)

    def ExportStateDict(self, request, context) -> Iterator[ckpt.StateDictChunk]:
        big = np.arange(10, dtype=np.float32)
        yield ckpt.StateDictChunk(key="param/a", shape=[2, 5], offset=6, dtype=pb.DTYPE_FP32,
                                  data=big[6:].tobytes())
        yield ckpt.StateDictChunk(key="state/adamw/a/step", shape=[], offset=0,
                                  dtype=pb.DTYPE_FP32, data=np.float32(7).tobytes())
        yield ckpt.StateDictChunk(key="param/a", shape=[2, 5], offset=0, dtype=pb.DTYPE_FP32,
                                  data=big[:6].tobytes())

    def ImportStateDict(self, request_iterator, context):
        *self.imports, self.import_end = list(request_iterator)
        return ckpt.ImportStateDictResponse(tensors=len({c.key for c in self.imports}))


@pytest.fixture
def ranks() -> Iterator[List[FakeRank]]:
    fakes, servers, targets = [], [], []
    for r in range(2):
        fake = FakeRank(r)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        svc_grpc.add_OptimizerServiceServicer_to_server(fake, server)
        ckpt_grpc.add_CheckpointServiceServicer_to_server(fake, server)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(
                fake.health_check)}),))
        targets.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        fakes.append(fake)
        servers.append(server)
    for fake, target in zip(fakes, targets):
        fake.info = _session_info(targets)
        fake.target = target
    yield fakes
    for server in servers:
        server.stop(grace=None)


def _grads() -> dict:
    return {n: np.full(s, i + 1, np.float32) for i, (n, s) in enumerate(SHAPES.items())}


def _chunks(requests: List[svc.StepRequest]) -> List[pb.TensorChunk]:
    return [r.gradient for r in requests if r.WhichOneof("kind") == "gradient"]


@pytest.mark.parametrize("trainer", [0, 1])
def test_chunks_go_to_their_owners(ranks: List[FakeRank], trainer: int) -> None:
    with optstep.Client(rank_targets=[r.target for r in ranks], max_chunk_bytes=8) as client:
        reply = client.step("fake", 3, _grads(), trainer_id=trainer)
    for rank in ranks:
        (requests,) = rank.steps
        header, commit = requests[0].header, requests[-1].commit
        assert header.step == 3 and header.trainer_id == trainer
        # These fake ranks do not advertise Layout.returns_owned: the home rank returns all.
        assert header.skip_return == (rank.rank != trainer % 2)
        assert not header.return_owned
        owned = [i for i, owner in enumerate(OWNERS) if owner == rank.rank]
        chunks = _chunks(requests)
        assert sorted({c.param_id for c in chunks}) == owned
        assert all(len(c.data) <= 8 for c in chunks)
        assert commit.num_elements == sum(len(c.data) // 4 for c in chunks)
        for i in owned:
            values = np.concatenate([np.frombuffer(c.data, np.float32)
                                     for c in chunks if c.param_id == i])
            np.testing.assert_array_equal(values, np.full(values.size, i + 1))
    assert reply.step == 3 and reply.grad_norm == 1.5
    for i in range(3):
        np.testing.assert_array_equal(reply.params[i], np.full(SHAPES[list(SHAPES)[i]],
                                                               100 * (trainer % 2) + i))


def test_initial_values_go_to_every_rank(ranks: List[FakeRank]) -> None:
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        assert client.init_parameters("fake", _grads()) == 15
    for rank in ranks:
        (requests,) = rank.inits
        *values, last = requests
        assert sorted(r.values.param_id for r in values) == [0, 1, 2]
        assert all(r.session_id == "fake" for r in requests)
        # The final message tallies what came before it.
        assert last.HasField("end") and not last.HasField("values")
        data = b"".join(r.values.data for r in values)
        assert (last.end.chunks, last.end.bytes, last.end.tensors) == (3, len(data), 3)
        assert last.end.crc32 == zlib.crc32(data)


def test_initial_values_refused_while_the_group_heals_are_sent_again(
        ranks: List[FakeRank]) -> None:
    """A group that heals refuses initial values (UNAVAILABLE, nothing written): the client
    sends them again, to every rank, once it serves, within recovery_timeout; without one, the
    refusal is the caller's. Before, the first refusal always was."""
    ranks[1].unavailable_inits = 2
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        assert client.init_parameters("fake", _grads()) == 15
    assert [len(rank.inits) for rank in ranks] == [3, 3]
    ranks[1].unavailable_inits = 1
    with optstep.Client(rank_targets=[r.target for r in ranks], recovery_timeout=0) as client:
        with pytest.raises(optstep.UnavailableError, match="the group heals"):
            client.init_parameters("fake", _grads())


def test_initial_values_follow_a_rank_to_its_stand_in(ranks: List[FakeRank]) -> None:
    """Rank 1's process is away (its calls UNAVAILABLE) and rank 0 says a stand-in serves it: the
    values for rank 1 are sent there, not again and again to where it was until
    recovery_timeout ran out."""
    ranks[1].unavailable_inits = 1000
    ranks[0].directory = svc.ListSessionsResponse(rank_targets=[ranks[0].target] * 2,
                                                  stood_in_ranks=[1])
    with optstep.Client(rank_targets=[r.target for r in ranks], recovery_timeout=1) as client:
        assert client.init_parameters("fake", _grads()) == 15
    assert len(ranks[0].inits) == 2 and len(ranks[1].inits) == 1


def test_ranks_found_through_the_layout(ranks: List[FakeRank]) -> None:
    if "rank_targets" not in pb.Layout.DESCRIPTOR.fields_by_name:
        pytest.skip("this API version's Layout has no rank_targets")
    with optstep.Client(ranks[0].target) as client:
        client.step("fake", 1, _grads())
        assert client.num_ranks == 2
    assert len(ranks[1].steps) == 1


def test_too_few_ranks_known(ranks: List[FakeRank]) -> None:
    with optstep.Client(rank_targets=[ranks[0].target]) as client:
        with pytest.raises(optstep.FailedPreconditionError, match="2 ranks"):
            client.step("fake", 1, _grads())


def test_an_aborting_rank_aborts_the_step(ranks: List[FakeRank]) -> None:
    ranks[1].abort_steps = True
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        with pytest.raises(optstep.AbortedError, match="rank 1: step aborted") as raised:
            client.step("fake", 1, _grads())
    assert raised.value.code == grpc.StatusCode.ABORTED


@pytest.mark.parametrize("native_path", ["1", "0"])
def test_a_failing_rank_ends_the_step_while_another_waits(ranks: List[FakeRank], native_path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 0 waits (in its collectives, for rank 1) while rank 1 refuses the step: the trainer
    # sees rank 1's error at once instead of after rank 0's answer (native path and Python).
    monkeypatch.setenv("OPTSTEP_NATIVE", native_path)
    ranks[0].hold_steps = threading.Event()
    ranks[1].abort_steps = True
    threading.Timer(10.0, ranks[0].hold_steps.set).start()  # ends a wait the client would not
    began = time.monotonic()
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        with pytest.raises(optstep.AbortedError, match="rank 1: step aborted"):
            client.step("fake", 1, _grads())
    assert time.monotonic() - began < 5.0


@pytest.mark.parametrize("native_path", ["1", "0"])
def test_a_stream_its_server_cancelled_fails_the_step_as_unavailable(
        ranks: List[FakeRank], native_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 1's server cancels its stream (it stopped: a stand-in giving way to its rank's own
    # process) while rank 0 waits in its collectives. The trainer sees UNAVAILABLE at once, which
    # its recovery redoes, rather than taking the cancel for its own and waiting on rank 0.
    monkeypatch.setenv("OPTSTEP_NATIVE", native_path)
    ranks[0].hold_steps = threading.Event()
    ranks[1].cancel_steps = True
    threading.Timer(10.0, ranks[0].hold_steps.set).start()  # ends a wait the client would not
    began = time.monotonic()
    with optstep.Client(rank_targets=[r.target for r in ranks], recovery_timeout=0) as client:
        with pytest.raises(optstep.UnavailableError, match="cancelled"):
            client.step("fake", 1, _grads())
    assert time.monotonic() - began < 5.0


def test_state_dict_streams(ranks: List[FakeRank]) -> None:
    with optstep.Client(ranks[0].target, max_chunk_bytes=8) as client:
        exported = client.export_state_dict("fake")
        assert exported["state/adamw/a/step"].shape == () and exported["state/adamw/a/step"] == 7
        np.testing.assert_array_equal(exported["param/a"],
                                      np.arange(10, dtype=np.float32).reshape(2, 5))
        answer = client.import_state_dict("fake", exported)
    assert answer.tensors == 2
    chunks = ranks[0].imports
    end = ranks[0].import_end.end
    assert ranks[0].import_end.HasField("end") and not ranks[0].import_end.key
    assert (end.chunks, end.tensors) == (len(chunks), 2)
    assert end.crc32 == zlib.crc32(b"".join(c.data for c in chunks))
    assert chunks[0].session_id == "fake" and all(not c.session_id for c in chunks[1:])
    assert all(len(c.data) <= 8 for c in chunks)
    pieces = [c for c in chunks if c.key == "param/a"]
    assert [c.offset for c in pieces] == [0, 2, 4, 6, 8] and list(pieces[0].shape) == [2, 5]
    (scalar,) = [c for c in chunks if c.key == "state/adamw/a/step"]
    assert list(scalar.shape) == [] and np.frombuffer(scalar.data, np.float32)[0] == 7


def test_state_dict_element_types(ranks: List[FakeRank]) -> None:
    """Counters go as int64, bf16 (torch tensors or uint16 bits) as bf16, floats as they are."""
    import torch

    state = {"meta/step": torch.tensor(5), "group/step": np.int32(3),
             "t": torch.ones(2, dtype=torch.bfloat16), "bits": np.ones(2, np.uint16),
             "half": np.ones(2, np.float16), "f": torch.ones(2)}
    with optstep.Client(ranks[0].target) as client:
        client.import_state_dict("fake", state)
        with pytest.raises(optstep.InvalidArgumentError, match="cannot go as int64"):
            client.step("fake", 1, [optstep.GradientSlice("b", np.ones(4), dtype="int64")])
    sent = {c.key: (c.dtype, c.data) for c in ranks[0].imports}
    assert sent["meta/step"] == (pb.DTYPE_INT64, np.int64(5).tobytes())
    assert sent["group/step"] == (pb.DTYPE_INT64, np.int64(3).tobytes())
    assert sent["t"] == (pb.DTYPE_BF16, np.full(2, 0x3F80, np.uint16).tobytes())
    assert sent["bits"] == (pb.DTYPE_BF16, np.ones(2, np.uint16).tobytes())
    assert sent["half"][0] == pb.DTYPE_FP16 and sent["f"][0] == pb.DTYPE_FP32


def test_a_creation_retried_after_its_answer_was_lost_keeps_its_request_id(
        ranks: List[FakeRank]) -> None:
    """Rank 0 made the session and its answer was lost; rank 1 serves rank 0 now (a stand-in).
    The retry there carries the same request id, so the server answers the session the first
    attempt made instead of making a second one; another call is another creation."""
    ranks[0].lose_creates = True

    def stand_in() -> None:  # from the lost answer on, not before: the first attempt is rank 0's
        ranks[1].directory = svc.ListSessionsResponse(rank_targets=[ranks[1].target] * 2,
                                                      stood_in_ranks=[0])

    ranks[0].after_create = stand_in
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        info, _ = client.create_session(_session_info([]).spec)
        assert info.session_id == "fake"
        (first,), (retried,) = ranks[0].creates, ranks[1].creates
        assert len(first.request_id) == 32 and int(first.request_id, 16) >= 0
        assert retried.request_id == first.request_id
        client.create_session(_session_info([]).spec)
    assert ranks[1].creates[1].request_id != first.request_id


# An address where nothing listens: a rank away, or a stand-in that gave way.
_NOBODY = "127.0.0.1:1"


def test_a_client_follows_a_stand_in_at_connect(ranks: List[FakeRank]) -> None:
    """Given a stood-in rank's own address, which answers nothing, the client connects at once:
    the first rank that answers says where the stand-in is (not after the connect timeout)."""
    ranks[0].directory = svc.ListSessionsResponse(rank_targets=[ranks[0].target, ranks[1].target],
                                                  stood_in_ranks=[1])
    began = time.monotonic()
    with optstep.Client(rank_targets=[ranks[0].target, _NOBODY], connect_timeout=10):
        assert time.monotonic() - began < 5, "waited for the rank's own address"


def test_a_client_takes_a_ranks_own_process_over_a_stand_in_that_is_gone(
        ranks: List[FakeRank]) -> None:
    """Right after a stand-in gave way the group may still list it: the client takes the rank's
    own process, which answers, rather than failing on the stand-in, which does not."""
    ranks[0].directory = svc.ListSessionsResponse(rank_targets=[ranks[0].target, _NOBODY],
                                                  stood_in_ranks=[1])
    with optstep.Client(rank_targets=[r.target for r in ranks], connect_timeout=2) as client:
        assert client._ranks.stand_in(1) is None  # reached at its own address


def test_a_health_check_of_a_wedged_rank_0_finds_its_stand_in(ranks: List[FakeRank]) -> None:
    """Rank 0's process hangs (it takes calls and never answers them): its health check runs
    out of time, and the client asks the other ranks where rank 0 is served now, as it does when
    rank 0 does not answer at all."""
    with optstep.Client(rank_targets=[r.target for r in ranks], rpc_timeout=0.5) as client:
        ranks[0].health_delay = 3.0
        ranks[1].directory = svc.ListSessionsResponse(rank_targets=[ranks[1].target] * 2,
                                                      stood_in_ranks=[0])
        assert client.check_health()
        assert client._ranks.rank0().target == ranks[1].target


def test_a_call_on_rank_0_cancelled_by_its_stopping_server_finds_where_rank_0_is_served(
        ranks: List[FakeRank]) -> None:
    """A stand-in for rank 0 that gives way to rank 0's own process cancels the calls it still
    runs as its server stops. The client never cancels a unary call itself: it takes CANCELLED as
    rank 0 being away, asks the other ranks where it is served now, and calls there. Before, the
    call failed CANCELLED."""
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        ranks[0].cancel_gets = True
        ranks[1].directory = svc.ListSessionsResponse(rank_targets=[ranks[1].target] * 2,
                                                      stood_in_ranks=[0])
        assert client.get_session("fake").session_id == "fake"  # rank 1 answered it


def test_a_restarted_trainer_attached_at_step_zero_takes_a_refused_init(
        ranks: List[FakeRank]) -> None:
    """A trainer restarted while a lost rank interrupted step 1 of its session attaches to it:
    the session still reads step 0, and the ranks that applied their part of step 1 refuse the
    initial values (FAILED_PRECONDITION), which the run that made the session set. The optimizer
    is made all the same, and step 1 is redone. Before, a single trainer's constructor raised at
    every restart."""
    torch = pytest.importorskip("torch")
    from optstep.torch import RemoteOptimizer

    model = torch.nn.Module()
    for name, shape in SHAPES.items():
        model.register_parameter(name, torch.nn.Parameter(torch.zeros(shape)))
    for rank in ranks:
        rank.info.spec.num_trainers = 1
        rank.info.groups.add(id=0, sub_optimizer="sgd", param_ids=[0, 1, 2], lr=0.1)
        rank.attach = True
        rank.refuse_inits = ("session 'fake': initial values can only be set before the first "
                             f"step (rank {rank.rank} applied step 1 to its own parameters ...)")
    with optstep.Client(rank_targets=[r.target for r in ranks]) as client:
        remote = RemoteOptimizer(model, client, optimizer="sgd", session_name="fake")
        assert remote.attached and remote.session_id == "fake"
        assert ranks[0].inits, "the initial values were sent"
        ranks[0].attach = False  # a session this call made: the refusal is the caller's error
        with pytest.raises(optstep.FailedPreconditionError, match="applied step 1"):
            RemoteOptimizer(model, client, optimizer="sgd", session_name="fake")
