"""One trainer's Step stream to one rank: the requests (header, gradient chunks, commit) and the
reading of the answer (a StepResult, then the parameter chunks from the rank that returns them).
Mirrors client/cpp/step_call.cc. Internal to the client.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from optstep.chunks import ParamAssembler, RankContribution, WireChunk
from optstep.errors import InternalError
from optstep.v1 import optimizer_service_pb2 as svc_pb2, tensor_pb2

__all__ = ["tensor_chunk", "step_requests", "receive_step"]


def tensor_chunk(chunk: WireChunk) -> tensor_pb2.TensorChunk:
    return tensor_pb2.TensorChunk(param_id=chunk.param_id, offset=chunk.offset,
                                  dtype=chunk.dtype, data=chunk.data.tobytes())


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
