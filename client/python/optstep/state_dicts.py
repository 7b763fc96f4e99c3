"""State dicts on the wire: ExportStateDict's chunks into (nested) dicts of arrays, and a dict
into ImportStateDict's chunks (docs/api.md, "Checkpoints and state dicts").

The three layouts of ExportStateDict answer:

- ``"merged"``: ``{key: array}``, keys "param/<name>", "state/<sub-optimizer>/<name>/<key>", ...;
- ``"by_model_chunk"``: ``{chunk_key: {key: array}}``, chunk keys "model<K>" (or "model" for one
  chunk);
- ``"by_sub_optimizer"``: ``{sub_optimizer: {chunk_key: {key: array}}}`` (spec §7.2).

Import takes any of them back: a value that is itself a mapping is one level of the layout.
A Save's or Load's progress stream is followed by :func:`follow_progress`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import grpc
import numpy as np

from optstep import dtypes
from optstep.chunks import TensorBuffer, split_array
from optstep.errors import InvalidArgumentError, OptstepError, from_rpc_error
from optstep.stream_end import StreamTally
from optstep.v1 import checkpoint_service_pb2 as ckpt_pb2

__all__ = ["LAYOUTS", "layout_of", "assemble", "import_chunks"]

LAYOUTS: Dict[str, ckpt_pb2.StateDictLayout] = {
    "merged": ckpt_pb2.STATE_DICT_LAYOUT_MERGED,
    "by_model_chunk": ckpt_pb2.STATE_DICT_LAYOUT_BY_MODEL_CHUNK,
    "by_sub_optimizer": ckpt_pb2.STATE_DICT_LAYOUT_BY_SUB_OPTIMIZER,
}

# (sub_optimizer, chunk_key, key): where one tensor sits in a keyed layout.
_Place = Tuple[str, str, str]


def layout_of(name: str) -> ckpt_pb2.StateDictLayout:
    """The proto layout of `name`; InvalidArgumentError names the choices."""
    if name not in LAYOUTS:
        raise InvalidArgumentError(f"state dict layout {name!r} is not one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def assemble(chunks: Iterable[ckpt_pb2.StateDictChunk], layout: str) -> Dict[str, Any]:
    """The tensors of an export stream, shaped, nested as `layout` says (module docstring)."""
    buffers: Dict[_Place, TensorBuffer] = {}
    shapes: Dict[_Place, Tuple[int, ...]] = {}
    for chunk in chunks:
        place = (chunk.sub_optimizer, chunk.chunk_key, chunk.key)
        buffer = buffers.get(place)
        if buffer is None:
            shape = tuple(int(d) for d in chunk.shape)
            where = "/".join(p for p in place[:2] if p)
            buffer = TensorBuffer(f"state dict key '{chunk.key}'" + (f" of {where}" if where
                                                                     else ""),
                                  int(np.prod(shape, dtype=np.int64)), chunk.dtype)
            buffers[place], shapes[place] = buffer, shape
        buffer.add(chunk.offset, chunk.dtype, chunk.data)
    out: Dict[str, Any] = {}
    for (sub_optimizer, chunk_key, key), buffer in buffers.items():
        level = out
        if layout == "by_sub_optimizer":
            level = level.setdefault(sub_optimizer, {})
        if layout != "merged":
            level = level.setdefault(chunk_key, {})
        level[key] = buffer.finish().reshape(shapes[(sub_optimizer, chunk_key, key)])
    return out


def _flatten(state: Mapping[str, Any]) -> List[Tuple[_Place, Any]]:
    """(place, value) of every tensor of a merged, by-chunk or by-sub-optimizer dict."""
    tensors: List[Tuple[_Place, Any]] = []
    for outer, value in state.items():
        if not isinstance(value, Mapping):
            tensors.append((("", "", outer), value))
            continue
        for inner, inner_value in value.items():
            if not isinstance(inner_value, Mapping):  # {chunk_key: {key: value}}
                tensors.append((("", outer, inner), inner_value))
                continue
            for key, tensor in inner_value.items():  # {sub_optimizer: {chunk_key: {key: value}}}
                tensors.append(((outer, inner, key), tensor))
    return tensors


def import_chunks(session_id: str, state: Mapping[str, Any],
                  max_chunk_bytes: int) -> Iterator[ckpt_pb2.StateDictChunk]:
    """ImportStateDict's messages for `state` (any layout; numpy arrays or torch tensors, uint16
    arrays as bf16 bits, other integers as int64 counters), ending with the StreamEnd. The
    tensors are converted (and checked) before the first message."""
    prepared = []
    for (sub_optimizer, chunk_key, key), value in _flatten(state):
        array, wire = dtypes.to_wire_array(value, dtypes.state_dict_dtype(value),
                                           what=f"state dict key '{key}'")
        prepared.append((sub_optimizer, chunk_key, key, tuple(np.shape(value)), array, wire))
    return _messages(session_id, prepared, max_chunk_bytes)


def _messages(session_id: str, prepared: List[Tuple[str, str, str, Tuple[int, ...], np.ndarray,
                                                    Any]],
              max_chunk_bytes: int) -> Iterator[ckpt_pb2.StateDictChunk]:
    # A transaction: the server applies the dict only once the final message arrived.
    tally = StreamTally()
    first = True
    for sub_optimizer, chunk_key, key, shape, array, wire in prepared:
        pieces = split_array(array, max_chunk_bytes) if array.size else [(0, array)]
        for start, piece in pieces:
            yield ckpt_pb2.StateDictChunk(session_id=session_id if first else "", key=key,
                                          shape=shape, offset=start, dtype=wire,
                                          data=tally.add(piece.tobytes()), chunk_key=chunk_key,
                                          sub_optimizer=sub_optimizer)
            first = False
    yield ckpt_pb2.StateDictChunk(session_id=session_id if first else "",
                                  end=tally.end(len(prepared)))


def follow_progress(rpc: Callable[..., Any], request: Any,
                    on_progress: Optional[Callable[[Any], None]], timeout: float,
                    wait_for_ready: bool) -> ckpt_pb2.CheckpointProgress:
    """Reads a Save's or Load's progress stream (`rpc(request)`) to its end, each message
    passed to `on_progress`; answers the last one."""
    last = ckpt_pb2.CheckpointProgress()
    try:
        for progress in rpc(request, timeout=timeout, wait_for_ready=wait_for_ready):
            last = progress
            if on_progress is not None:
                on_progress(progress)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    return last


def read_export(rpc: Callable[..., Any], request: ckpt_pb2.ExportStateDictRequest, layout: str,
                timeout: float, wait_for_ready: bool) -> Dict[str, Any]:
    """Reads an ExportStateDict stream (`rpc(request)`) into the dict of `layout` (assemble);
    a stream broken part way is cancelled."""
    call = rpc(request, timeout=timeout, wait_for_ready=wait_for_ready)
    try:
        return assemble(call, layout)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    except OptstepError:
        call.cancel()
        raise
