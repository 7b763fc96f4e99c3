"""One trainer's Step stream to one rank: the requests (header, gradient chunks, commit) and the
reading of the answer (a StepResult, then the parameter chunks from the rank that returns them);
and one rank's PullParameters answer, read into the same assembler. Mirrors
client/cpp/step_call.cc. Internal to the client.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, List, Optional, Sequence

import grpc

from optstep import dtypes
from optstep.chunks import ParamAssembler, RankContribution, WireChunk
from optstep.client_types import GroupSchedule, Parameters
from optstep.errors import (AbortedError, InternalError, InvalidArgumentError, OptstepError,
                            UnavailableError, from_rpc_error)
from optstep.layout import SessionLayout
from optstep.rank_channels import timeout_by
from optstep.stream_end import StreamTally
from optstep.v1 import optimizer_service_pb2 as svc_pb2, tensor_pb2

__all__ = ["tensor_chunk", "step_requests", "receive_step", "exchange_steps"]


def check_step(session_id: str, step: int) -> None:
    """InvalidArgumentError unless `step` is a step number."""
    if step <= 0:
        raise InvalidArgumentError(f"session '{session_id}': step {step} is not a step; "
                                   "steps are numbered from 1")


def step_header(session_id: str, step: int, trainer_id: int, groups: Sequence[GroupSchedule],
                wire: dtypes.WireDType, return_ids: Sequence[int]) -> svc_pb2.StepHeader:
    """The header of one trainer's Step stream."""
    header = svc_pb2.StepHeader(session_id=session_id, step=step, trainer_id=trainer_id,
                                return_dtype=wire, return_param_ids=return_ids)
    for group in groups:
        header.groups.add(group_id=group.group_id, lr=group.lr, weight_decay=group.weight_decay)
    return header


def pull_from(service: Any, request: svc_pb2.PullParametersRequest, assembler: ParamAssembler,
              *, timeout: float, wait_for_ready: bool) -> int:
    """Reads one rank's PullParameters answer into `assembler`; answers the step it is of (0
    when the rank sent nothing)."""
    call = service.PullParameters(request, timeout=timeout, wait_for_ready=wait_for_ready)
    step = 0
    try:
        for i, response in enumerate(call):
            if i == 0:
                step = response.step
            if response.HasField("parameter"):
                chunk = response.parameter
                assembler.add(chunk.param_id, chunk.offset, chunk.dtype, chunk.data)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    except OptstepError:
        call.cancel()
        raise
    return step


def pull_whole(rank: Any, request: svc_pb2.PullParametersRequest, layout: SessionLayout,
               wire: int, ids: Sequence[int], *, timeout: float,
               wait_for_ready: bool) -> Parameters:
    """Parameters `ids` from one rank that holds them all (REPLICATED storage)."""
    assembler = ParamAssembler(layout, wire, ids)
    step = pull_from(rank.service, request, assembler, timeout=timeout,
                     wait_for_ready=wait_for_ready)
    return Parameters(step, assembler.finish())


def pull_owned(ranks: Sequence[Any], request: svc_pb2.PullParametersRequest,
               layout: SessionLayout, wire: int, ids: Sequence[int], *, timeout: float,
               wait_for_ready: bool, deadline: Optional[float] = None) -> Parameters:
    """Parameters `ids`, each from its owner among `ranks` (OWNERS storage), all of one step:
    AbortedError when a step ran during the pull. Each stream within `timeout`, all of them by
    `deadline` (time.monotonic(); None: none)."""
    owners = layout.owners_of(ids)
    assembler = ParamAssembler(layout, wire, ids)
    steps = [pull_from(ranks[r].service, request, assembler,
                       timeout=timeout_by(timeout, deadline), wait_for_ready=wait_for_ready)
             for r in owners]
    for r, step in zip(owners, steps):
        if step != steps[0]:
            raise AbortedError(f"PullParameters: rank {r} answered step {step}, rank "
                               f"{owners[0]} step {steps[0]} (a step ran during the pull); "
                               "pull again")
    return Parameters(steps[0] if steps else 0, assembler.finish())


def tensor_chunk(chunk: WireChunk) -> tensor_pb2.TensorChunk:
    return tensor_pb2.TensorChunk(param_id=chunk.param_id, offset=chunk.offset,
                                  dtype=chunk.dtype, data=chunk.data.tobytes())


# The details of a call cancelled because this client closed its channel (grpc's own words).
_LOCAL_CLOSE = "Channel closed!"


def init_requests(session_id: str,
                  chunks: Sequence[WireChunk]) -> Iterator[svc_pb2.InitParametersRequest]:
    """An InitParameters stream of `chunks`: a transaction, which the server writes only once
    its final message (the tally of what came before) arrived."""
    tally = StreamTally()
    for chunk in chunks:
        values = tensor_chunk(chunk)
        tally.add(values.data)
        yield svc_pb2.InitParametersRequest(session_id=session_id, values=values)
    yield svc_pb2.InitParametersRequest(session_id=session_id,
                                        end=tally.end(len({c.param_id for c in chunks})))


def step_requests(header: svc_pb2.StepHeader,
                  contribution: RankContribution) -> Iterator[svc_pb2.StepRequest]:
    yield svc_pb2.StepRequest(header=header)
    for chunk in contribution.chunks:
        yield svc_pb2.StepRequest(gradient=tensor_chunk(chunk))
    yield svc_pb2.StepRequest(commit=svc_pb2.StepCommit(num_elements=contribution.num_elements))


def receive_step(call: Any, assembler: Optional[ParamAssembler]) -> svc_pb2.StepResult:
    """Reads a StepResult and the parameter chunks that follow it (into `assembler`; None: none
    may follow). grpc.RpcError carries the stream's status."""
    responses = iter(call)
    first = next(responses, None)
    if first is None:
        raise InternalError("Step stream ended OK without a StepResult")
    if first.WhichOneof("kind") != "result":
        raise InternalError("Step stream began with a parameter chunk, not a StepResult")
    result: svc_pb2.StepResult = first.result
    chunks = 0
    for response in responses:
        if response.WhichOneof("kind") != "parameter":
            raise InternalError("Step stream sent a second StepResult")
        if assembler is None:
            raise InternalError("Step stream sent parameters that were not asked for")
        chunk = response.parameter
        assembler.add(chunk.param_id, chunk.offset, chunk.dtype, chunk.data)
        chunks += 1
    if chunks != result.params_to_follow:
        raise InternalError(f"Step stream announced {result.params_to_follow} parameter chunks "
                            f"and sent {chunks}")
    return result


def exchange_steps(services: Sequence[Any], header: svc_pb2.StepHeader,
                   plan: Sequence[RankContribution], return_rank: Optional[int],
                   skip_return: bool,
                   assembler: Optional[ParamAssembler], *, timeout: float,
                   wait_for_ready: bool,
                   segments: Optional[Sequence[int]] = None) -> List[svc_pb2.StepResult]:
    """One step of one trainer over every rank of the layout (`services`, by rank): answers each
    rank's StepResult; the parameters from `return_rank` (None: from every rank, each sending
    those it owns under OWNERS storage) go into `assembler`. With `segments` (by rank: the
    shared memory segments, optstep.shared_memory) the streams carry no chunks and no
    parameters: the ranks read and write the segments.

    Every rank gets this trainer's commit (with its share of the chunks, possibly none); one
    rank, spread over trainers, streams the parameters back (or every rank its own). gRPC
    consumes each request iterator on its own thread, so the streams are sent concurrently.
    """
    calls: List[Any] = []
    # The first rank whose stream failed: every stream is cancelled at once, so that a rank that
    # refused or lost the step (one still healing while the others took it) is seen without
    # waiting for a rank whose step waits in the collectives for it.
    failed: List[Any] = []
    # Set once this client cancels the streams: a stream CANCELLED before that was cancelled by
    # its rank's server (it stopped: a stand-in giving way to the rank's own process).
    cancelling = threading.Event()
    lock = threading.Lock()

    def cancel_all() -> None:
        cancelling.set()
        _cancel(calls)

    def on_done(call: Any) -> None:
        with lock:
            if failed or call.code() == grpc.StatusCode.OK or \
                    (call.code() == grpc.StatusCode.CANCELLED and
                     (cancelling.is_set() or call.details() == _LOCAL_CLOSE)):
                return
            failed.append(call)
        cancel_all()

    for r, service in enumerate(services):
        rank_header = svc_pb2.StepHeader()
        rank_header.CopyFrom(header)
        rank_header.skip_return = skip_return or return_rank not in (None, r)
        if segments is not None:
            rank_header.shared_memory_segment = segments[r]
        calls.append(service.Step(step_requests(rank_header, plan[r]), timeout=timeout,
                                  wait_for_ready=wait_for_ready))
    for call in list(calls):
        call.add_done_callback(on_done)
    results: List[svc_pb2.StepResult] = []
    try:
        for r, call in enumerate(calls):
            returns = return_rank in (None, r) and not skip_return
            result = receive_step(call, assembler if returns else None)
            if results and result.step != results[0].step:
                raise InternalError(f"rank {r} answered step {result.step}, rank 0 step "
                                    f"{results[0].step}")
            results.append(result)
    except grpc.RpcError as e:
        with lock:
            first = failed[0] if failed else e
            # (Not "Channel closed!": this client's own channel closed under the call.)
            by_its_server = first in calls and first.code() == grpc.StatusCode.CANCELLED and \
                (bool(failed) or not cancelling.is_set()) and first.details() != _LOCAL_CLOSE
        cancel_all()
        if by_its_server:
            raise UnavailableError(
                f"rank {calls.index(first)} cancelled its Step stream ({first.details()}): its "
                "server stopped; the step is redone once the group serves") from None
        raise from_rpc_error(first) from None
    except OptstepError:
        cancel_all()
        raise
    return results


def _cancel(calls: Sequence[Any]) -> None:
    for call in calls:
        call.cancel()
