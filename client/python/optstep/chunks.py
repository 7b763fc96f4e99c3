"""Tensors to wire chunks and back.

Outgoing: a trainer's gradients (or initial values) are validated against the session, split
into pieces of at most ``max_chunk_bytes`` (whole elements) and grouped by the rank that owns
their parameter. Incoming: the chunks of a reply are collected into complete host arrays, and
what the server sent is checked (known ids, the dtype asked for, ranges inside the tensor, no
overlap, full coverage); a failed check is the server's fault, so InternalError. Mirrors
client/cpp/chunking.h and param_assembler.h. No gRPC here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from optstep import dtypes
from optstep.errors import InternalError, InvalidArgumentError
from optstep.layout import ParamLayout, ParamRef, SessionLayout

__all__ = [
    "GradientSlice",
    "WireChunk",
    "RankContribution",
    "as_slices",
    "check_range",
    "plan_contributions",
    "split_array",
    "TensorBuffer",
    "ParamAssembler",
]


@dataclasses.dataclass
class GradientSlice:
    """A contiguous range of one parameter's gradient (or values).

    `values` (numpy array, torch tensor, anything ``np.asarray`` takes) is flattened row-major
    and lands at element `offset` of the parameter. `dtype` converts it before sending (e.g.
    "bf16" halves the bytes); by default it goes as its own type (see
    :func:`optstep.dtypes.to_wire_array`).
    """

    param: ParamRef
    values: Any
    offset: int = 0
    dtype: Optional[dtypes.DTypeLike] = None


@dataclasses.dataclass
class WireChunk:
    """One TensorChunk to send: `data` is a 1-D little-endian array of `dtype`'s elements."""

    param_id: int
    offset: int
    dtype: dtypes.WireDType
    data: np.ndarray


@dataclasses.dataclass
class RankContribution:
    """What one Step stream carries to one rank."""

    chunks: List[WireChunk] = dataclasses.field(default_factory=list)
    num_elements: int = 0  # for the StepCommit


def as_slices(layout: SessionLayout, values: Any, what: str) -> List[GradientSlice]:
    """Whole tensors (a mapping by id or name) become slices at offset 0, after a size/shape
    check; anything else is taken as an iterable of GradientSlices."""
    if not isinstance(values, Mapping):
        return list(values)
    slices = []
    for ref, value in values.items():
        param = layout.param(ref)
        shape = tuple(np.shape(value))
        size = int(np.prod(shape, dtype=np.int64))
        if size != param.numel or (len(shape) > 1 and shape != param.shape):
            raise InvalidArgumentError(
                f"param '{param.name}': {what} of shape {list(shape)}, expected "
                f"{list(param.shape)} ({param.numel} elements)")
        slices.append(GradientSlice(param.param_id, value))
    return slices


def split_array(array: np.ndarray, max_chunk_bytes: int) -> Iterator[Tuple[int, np.ndarray]]:
    """(start element, piece) of a 1-D array in pieces of at most `max_chunk_bytes`."""
    step = max(1, max_chunk_bytes // array.itemsize)
    for start in range(0, array.size, step):
        yield start, array[start:start + step]


def check_range(param: ParamLayout, offset: int, count: int) -> None:
    """InvalidArgumentError unless elements [offset, offset + count) lie inside `param`."""
    end = offset + count
    if offset < 0 or end > param.numel:
        raise InvalidArgumentError(f"param '{param.name}': range [{offset}, {end}) exceeds "
                                   f"its {param.numel} elements (shape {list(param.shape)})")


def plan_contributions(layout: SessionLayout, slices: Sequence[GradientSlice],
                       max_chunk_bytes: int) -> List[RankContribution]:
    """Validates `slices`, converts and splits them, and groups the chunks by owner rank.

    Answers one contribution per rank of the layout (possibly empty: the trainer still commits
    there). NotFoundError for an unknown parameter; InvalidArgumentError for a range past the
    parameter's end, a negative offset or an element type that cannot go on the wire.
    """
    plan = [RankContribution() for _ in range(layout.world_size)]
    for piece in slices:
        param = layout.param(piece.param)
        array, wire = dtypes.to_wire_array(piece.values, piece.dtype,
                                           what=f"param '{param.name}'")
        offset = int(piece.offset)
        check_range(param, offset, array.size)
        target = plan[param.owner]
        for start, part in split_array(array, max_chunk_bytes):
            target.chunks.append(WireChunk(param.param_id, offset + start, wire, part))
        target.num_elements += array.size
    return plan


class TensorBuffer:
    """One tensor being received in pieces: checks ranges and, at the end, coverage."""

    def __init__(self, what: str, numel: int, dtype: int) -> None:
        self.what = what
        self.dtype = dtype
        self.values = np.empty(numel, dtypes.numpy_dtype(dtype))
        self._ranges: List[Tuple[int, int]] = []

    def add(self, offset: int, dtype: int, data: bytes) -> None:
        if dtype != self.dtype:
            raise InternalError(f"{self.what}: chunk of dtype {dtypes.dtype_name(dtype)}, "
                                f"expected {dtypes.dtype_name(self.dtype)}")
        size = dtypes.element_size(dtype)
        if len(data) % size:
            raise InternalError(f"{self.what}: chunk of {len(data)} bytes is not a whole number "
                                f"of {dtypes.dtype_name(dtype)} elements")
        end = offset + len(data) // size
        if end > self.values.size:
            raise InternalError(f"{self.what}: chunk [{offset}, {end}) exceeds its "
                                f"{self.values.size} elements")
        self.values[offset:end] = np.frombuffer(data, dtype=self.values.dtype)
        self._ranges.append((offset, end))

    def finish(self) -> np.ndarray:
        """The complete 1-D values; InternalError for an overlap or a gap."""
        covered = 0
        for begin, end in sorted(self._ranges):
            if begin < covered:
                raise InternalError(f"{self.what}: chunks overlap at element {begin}")
            if begin > covered:
                break
            covered = end
        if covered != self.values.size:
            raise InternalError(f"{self.what}: received elements [0, {covered}) of "
                                f"{self.values.size}")
        return self.values


class ParamAssembler:
    """Collects the parameter chunks of one Step or PullParameters reply.

    `expected` are the ids that must arrive complete; None means every parameter of `layout`.
    """

    def __init__(self, layout: SessionLayout, dtype: int,
                 expected: Optional[Sequence[int]] = None) -> None:
        self._layout = layout
        self._dtype = dtype
        self._expected = set(range(layout.num_params) if not expected else expected)
        self._buffers: Dict[int, TensorBuffer] = {}
        self.chunks_added = 0

    def add(self, param_id: int, offset: int, dtype: int, data: bytes) -> None:
        if param_id not in self._expected:
            raise InternalError(f"session '{self._layout.session_id}': received param_id "
                                f"{param_id}, which was not asked for")
        buffer = self._buffers.get(param_id)
        if buffer is None:
            param = self._layout.params[param_id]
            buffer = TensorBuffer(f"param '{param.name}'", param.numel, self._dtype)
            self._buffers[param_id] = buffer
        buffer.add(offset, dtype, data)
        self.chunks_added += 1

    def finish(self) -> Dict[int, np.ndarray]:
        """Every expected parameter, shaped, keyed (and ordered) by id."""
        missing = sorted(self._expected - self._buffers.keys())
        if missing:
            names = [self._layout.params[i].name for i in missing[:5]]
            raise InternalError(f"session '{self._layout.session_id}': {len(missing)} "
                                f"parameter(s) not received, e.g. {names}")
        return {pid: self._buffers[pid].finish().reshape(self._layout.params[pid].shape)
                for pid in sorted(self._buffers)}
