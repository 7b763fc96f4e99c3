"""The native data path of :meth:`optstep.Client.step`: liboptstep_native.so over ctypes.

The library (client/python/native, built by Bazel; bazel/python_env.sh copies it into the
package) wraps the C++ client (client/cpp). A step is one call into it: the gradients go out by
pointer from the caller's numpy arrays or torch CPU tensors (fp32, bf16, fp16) and the returned
parameters are written by the library into buffers the caller gives (a model's own tensors),
so no Python work is done per chunk, and the GIL is released for the whole step.

The library is looked up at ``$OPTSTEP_NATIVE_LIB``, else next to this module.
``OPTSTEP_NATIVE=0`` turns the native path off (the client then uses its pure-Python path, which
gives the same results). Internal to the client.

Thread-safe: a :class:`NativeClient` may step from several threads at once.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading
from typing import (Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple)

import grpc
import numpy as np

from optstep import dtypes
from optstep.chunks import GradientSlice, check_range
from optstep.errors import EXPECTED_STEP_PAYLOAD, InvalidArgumentError, error_for
from optstep.layout import ParamRef, SessionLayout
from optstep.recovery import RewindRequired

__all__ = ["Connector", "NativeClient", "NativeResult", "Reply", "NativeStep", "available", "library_path",
           "NativeStepStream", "out_buffer", "host_view", "write_params", "run_step"]

_LIBRARY_NAME = "liboptstep_native.so"
_ERROR_BYTES = 4096
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _Options(ctypes.Structure):
    _fields_ = [("rank_targets", ctypes.POINTER(ctypes.c_char_p)),
                ("num_ranks", ctypes.c_uint32),
                ("connect_timeout_s", ctypes.c_double),
                ("rpc_timeout_s", ctypes.c_double),
                ("stream_timeout_s", ctypes.c_double),
                ("recovery_timeout_s", ctypes.c_double),
                ("wait_for_ready", ctypes.c_int32),
                ("max_message_bytes", ctypes.c_int32),
                ("stream_lookahead_bytes", ctypes.c_int32),
                ("max_frame_bytes", ctypes.c_int32),
                ("bdp_probe", ctypes.c_int32),
                ("max_chunk_bytes", ctypes.c_uint64),
                ("tls", ctypes.c_int32),
                ("tls_ca_file", ctypes.c_char_p),
                ("tls_cert_file", ctypes.c_char_p),
                ("tls_key_file", ctypes.c_char_p),
                ("tls_server_name", ctypes.c_char_p),
                ("token", ctypes.c_char_p)]


class _Slice(ctypes.Structure):
    _fields_ = [("param_id", ctypes.c_uint32), ("dtype", ctypes.c_uint32),
                ("offset", ctypes.c_uint64), ("count", ctypes.c_uint64),
                ("data", ctypes.c_void_p)]


class _Group(ctypes.Structure):
    _fields_ = [("group_id", ctypes.c_uint32), ("has_lr", ctypes.c_int32),
                ("lr", ctypes.c_double), ("has_weight_decay", ctypes.c_int32),
                ("weight_decay", ctypes.c_double)]


class _Out(ctypes.Structure):
    _fields_ = [("param_id", ctypes.c_uint32), ("dtype", ctypes.c_uint32),
                ("count", ctypes.c_uint64), ("data", ctypes.c_void_p)]


class Reply(NamedTuple):
    """A step's answer, field by field as optstep.StepReply."""

    step: int
    skipped: bool
    grad_norm: float
    clipped: bool
    params: Dict[int, np.ndarray]


class NativeResult(ctypes.Structure):
    """What the library answers about a step (``rewind``: ABORTED because the session came
    back at ``rewind_step``; ``expected_step``: the step a FAILED_PRECONDITION out of sequence
    expects, else 0)."""

    _fields_ = [("step", ctypes.c_uint64), ("skipped", ctypes.c_int32),
                ("clipped", ctypes.c_int32), ("grad_norm", ctypes.c_double),
                ("params_written", ctypes.c_uint32), ("rewind", ctypes.c_int32),
                ("rewind_step", ctypes.c_uint64), ("expected_step", ctypes.c_uint64)]


# optstep_native_step_finish's callback: a parameter is whole in its out.
_READY = ctypes.CFUNCTYPE(None, ctypes.c_uint32)

_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None
_load_error: Optional[str] = None


def library_path() -> pathlib.Path:
    """Where the library is looked up: $OPTSTEP_NATIVE_LIB, else next to this module."""
    override = os.environ.get("OPTSTEP_NATIVE_LIB")
    return pathlib.Path(override) if override else pathlib.Path(__file__).with_name(
        _LIBRARY_NAME)


def _load() -> Optional[ctypes.CDLL]:
    global _library, _load_error
    with _lock:
        if _library is not None or _load_error is not None:
            return _library
        path = library_path()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            _load_error = str(e)
            return None
        # A library of another release lays the step's result out otherwise: refused, not
        # written past the buffer (the client keeps its pure-Python data path).
        result_bytes = getattr(lib, "optstep_native_result_bytes", None)
        if result_bytes is not None:
            result_bytes.restype = ctypes.c_size_t
            result_bytes.argtypes = []
        if result_bytes is None or result_bytes() != ctypes.sizeof(NativeResult):
            _load_error = (f"{path}: a library of another release (its step result is not the "
                           f"{ctypes.sizeof(NativeResult)} bytes this package lays out)")
            return None
        lib.optstep_native_connect.restype = ctypes.c_void_p
        lib.optstep_native_connect.argtypes = [ctypes.POINTER(_Options),
                                               ctypes.POINTER(ctypes.c_int32),
                                               ctypes.c_char_p, ctypes.c_size_t]
        lib.optstep_native_close.restype = None
        lib.optstep_native_close.argtypes = [ctypes.c_void_p]
        lib.optstep_native_state_replaced.restype = None
        lib.optstep_native_state_replaced.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                      ctypes.c_uint64, ctypes.c_int64]
        lib.optstep_native_step.restype = ctypes.c_int32
        lib.optstep_native_step.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32,
            ctypes.POINTER(_Group), ctypes.c_size_t, ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_int32,
            ctypes.POINTER(_Slice), ctypes.c_size_t, ctypes.POINTER(_Out), ctypes.c_size_t,
            ctypes.POINTER(NativeResult), ctypes.c_char_p, ctypes.c_size_t]
        lib.optstep_native_step_open.restype = ctypes.c_void_p
        lib.optstep_native_step_open.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint32,
            ctypes.POINTER(_Group), ctypes.c_size_t, ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p, ctypes.c_size_t]
        lib.optstep_native_step_add.restype = ctypes.c_int32
        lib.optstep_native_step_add.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Slice),
                                                ctypes.c_size_t, ctypes.c_char_p,
                                                ctypes.c_size_t]
        lib.optstep_native_step_finish.restype = ctypes.c_int32
        lib.optstep_native_step_finish.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Out),
                                                   ctypes.c_size_t, _READY,
                                                   ctypes.POINTER(NativeResult),
                                                   ctypes.c_char_p, ctypes.c_size_t]
        lib.optstep_native_step_close.restype = None
        lib.optstep_native_step_close.argtypes = [ctypes.c_void_p]
        _library = lib
        return lib


def available() -> bool:
    """True when the native path is on ($OPTSTEP_NATIVE is not "0") and the library loads."""
    if os.environ.get("OPTSTEP_NATIVE", "1") == "0":
        return False
    return _load() is not None


def _raise(code: int, error: Any, result: Optional[NativeResult] = None) -> None:
    message = error.value.decode(errors="replace")
    payloads = {}
    if result is not None and result.expected_step:
        payloads[EXPECTED_STEP_PAYLOAD] = str(result.expected_step).encode()
    raise error_for(_CODES.get(code, grpc.StatusCode.UNKNOWN), message, payloads=payloads)


def _pointer(value: Any) -> int:
    """The address of a contiguous numpy array or torch tensor."""
    if isinstance(value, np.ndarray):
        return int(value.ctypes.data)
    return int(value.data_ptr())


class NativeStep:
    """One step's arguments in the library's structs; keeps the arrays they point to alive."""

    def __init__(self) -> None:
        self._slices: List[Tuple[int, int, int, int, int]] = []
        self._outs: List[Tuple[int, int, int, int]] = []
        self._keep: List[Any] = []

    def add_gradient(self, param_id: int, offset: int, values: Any,
                     dtype: Optional[dtypes.DTypeLike], what: str) -> int:
        """Adds one gradient slice (converted as the pure-Python path converts it); answers its
        element count."""
        array, wire = dtypes.to_wire_array(values, dtype, what=what)
        self._keep.append(array)
        self._slices.append((param_id, int(wire), offset, array.size, _pointer(array)))
        return int(array.size)

    def add_out(self, param_id: int, wire: int, buffer: Any) -> None:
        """The returned values of `param_id` go into `buffer` (contiguous, `wire`'s elements:
        a numpy array or a CPU torch tensor)."""
        self._keep.append(buffer)
        count = buffer.size if isinstance(buffer, np.ndarray) else buffer.numel()
        self._outs.append((param_id, wire, int(count), _pointer(buffer)))

    def slices(self) -> Any:
        array = (_Slice * len(self._slices))(*[_Slice(*s) for s in self._slices])
        return array, len(self._slices)

    def take_slices(self) -> Any:
        """The slices added since the last take (their arrays stay kept)."""
        array = self.slices()
        self._slices = []
        return array

    def outs(self) -> Any:
        array = (_Out * len(self._outs))(*[_Out(*o) for o in self._outs])
        return array, len(self._outs)


class NativeClient:
    """One connection of the C++ client to `rank_targets`, with the Python client's settings."""

    def __init__(self, rank_targets: Sequence[str], *, connect_timeout: float,
                 rpc_timeout: float, stream_timeout: float, recovery_timeout: float,
                 wait_for_ready: bool, max_message_bytes: int, stream_lookahead_bytes: int,
                 max_frame_bytes: int, bdp_probe: bool, max_chunk_bytes: int, tls: bool,
                 tls_ca: Optional[str], tls_cert: Optional[str], tls_key: Optional[str],
                 tls_server_name: Optional[str], token: Optional[str]) -> None:
        lib = _load()
        if lib is None:
            raise RuntimeError(f"optstep: no native library at {library_path()}: {_load_error}")
        self._lib = lib
        self.rank_targets = tuple(rank_targets)
        encoded = [t.encode() for t in self.rank_targets]
        targets = (ctypes.c_char_p * len(encoded))(*encoded)

        def text(value: Optional[str]) -> bytes:
            return (value or "").encode()

        options = _Options(targets, len(encoded), connect_timeout, rpc_timeout, stream_timeout,
                           recovery_timeout, int(wait_for_ready), max_message_bytes,
                           stream_lookahead_bytes, max_frame_bytes, int(bdp_probe),
                           max_chunk_bytes, int(tls), text(tls_ca), text(tls_cert),
                           text(tls_key), text(tls_server_name), text(token))
        code = ctypes.c_int32(0)
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        handle = lib.optstep_native_connect(ctypes.byref(options), ctypes.byref(code), error,
                                            _ERROR_BYTES)
        if not handle:
            _raise(code.value, error)
        self._handle: Optional[int] = handle
        # The C++ client is freed once closed and no step uses it any more (a step in flight on
        # another thread, an open step stream): closing it under them was a use after free.
        self._guard = threading.Lock()
        self._users = 0
        self._closed = False

    def close(self) -> None:
        with self._guard:
            self._closed = True
            handle = self._handle if self._users == 0 else None
            if handle:
                self._handle = None
        if handle:
            self._lib.optstep_native_close(handle)

    def state_replaced(self, session_id: str, step: int, trainer_id: Optional[int] = None) -> None:
        """Client::StateReplaced: the session's state was replaced at `step` (for `trainer_id`
        alone when given)."""
        handle = self.acquire()
        try:
            self._lib.optstep_native_state_replaced(
                handle, session_id.encode(), step, -1 if trainer_id is None else trainer_id)
        finally:
            self.release()

    def acquire(self) -> int:
        """The C++ client's handle, kept alive until the matching :meth:`release`."""
        with self._guard:
            if self._closed or not self._handle:
                raise RuntimeError("optstep: native client closed")
            self._users += 1
            return self._handle

    def release(self) -> None:
        with self._guard:
            self._users -= 1
            handle = self._handle if self._closed and self._users == 0 else None
            if handle:
                self._handle = None
        if handle:
            self._lib.optstep_native_close(handle)

    def step(self, session_id: str, step: int, trainer_id: int,
             groups: Sequence[Tuple[int, Optional[float], Optional[float]]],
             return_dtype: int, return_ids: Sequence[int], skip_return: bool,
             call: NativeStep) -> NativeResult:
        """One step (Client::Step, recovery included); raises RewindRequired when the session
        came back older, else the OptstepError of the code."""
        handle = self.acquire()
        try:
            group_array, ids = _schedule(groups, return_ids)
            slices, num_slices = call.slices()
            outs, num_outs = call.outs()
            result = NativeResult()
            error = ctypes.create_string_buffer(_ERROR_BYTES)
            code = self._lib.optstep_native_step(
                handle, session_id.encode(), step, trainer_id, group_array, len(groups),
                return_dtype, ids, len(return_ids), int(skip_return), slices, num_slices, outs,
                num_outs, ctypes.byref(result), error, _ERROR_BYTES)
        finally:
            self.release()
        if code and result.rewind:
            raise RewindRequired(session_id, int(result.rewind_step), step)
        if code:
            _raise(code, error, result)
        return result

    def open_step(self, session_id: str, step: int, trainer_id: int,
                  groups: Sequence[Tuple[int, Optional[float], Optional[float]]],
                  return_dtype: int, return_ids: Sequence[int], skip_return: bool) -> int:
        """Opens a step whose gradients are added later (Client::OpenStep): the stream's
        handle, for :class:`NativeStepStream`, which keeps the client in use (:meth:`acquire`)
        until it releases it as it closes."""
        client = self.acquire()
        try:
            group_array, ids = _schedule(groups, return_ids)
            code = ctypes.c_int32(0)
            error = ctypes.create_string_buffer(_ERROR_BYTES)
            handle = self._lib.optstep_native_step_open(
                client, session_id.encode(), step, trainer_id, group_array, len(groups),
                return_dtype, ids, len(return_ids), int(skip_return), ctypes.byref(code), error,
                _ERROR_BYTES)
        except BaseException:
            self.release()
            raise
        if not handle:
            self.release()
            _raise(code.value, error)
        return int(handle)


class NativeStepStream:
    """A step whose gradients are added as they are produced: :meth:`add` queues slices on the
    ranks' streams (gRPC sends them while the caller goes on), :meth:`finish` commits and
    answers as :func:`run_step`. Keeps every added array alive until closed. Thread-safe: adds
    may come from several threads; finish once."""

    def __init__(self, client: NativeClient, layout: SessionLayout, session_id: str, step: int,
                 trainer_id: int, groups: Sequence[Tuple[int, Optional[float], Optional[float]]],
                 wire: int, return_params: Optional[Sequence[ParamRef]],
                 skip_return: bool) -> None:
        return_ids = layout.param_ids(return_params or ())
        self._lib = client._lib
        self._layout = layout
        self._wire = wire
        self._return_ids = return_ids
        self._skip_return = skip_return
        self._lock = threading.Lock()
        self._call = NativeStep()
        self._client = client
        self._handle: Optional[int] = client.open_step(session_id, step, trainer_id, groups,
                                                       wire, return_ids, skip_return)

    def add(self, slices: Sequence[GradientSlice]) -> None:
        with self._lock:
            if not self._handle:
                raise RuntimeError("optstep: step stream closed")
            _add_gradients(self._call, self._layout, slices)
            array, count = self._call.take_slices()
            error = ctypes.create_string_buffer(_ERROR_BYTES)
            code = self._lib.optstep_native_step_add(self._handle, array, count, error,
                                                     _ERROR_BYTES)
        if code:
            _raise(code, error)

    def finish(self, param_out: Mapping[int, Any],
               on_ready: Optional[Callable[[int], None]] = None) -> Reply:
        """Commits and waits for the step; answers as :func:`run_step`, except that each
        parameter is written into its buffer as it arrives, `on_ready(param_id)` (on this
        thread) telling when one is whole, and a step that fails may have written some."""
        if not self._handle:
            raise RuntimeError("optstep: step stream closed")
        params = _add_outs(self._call, self._layout, self._wire, self._return_ids,
                           self._skip_return, param_out)
        outs, num_outs = self._call.outs()
        result = NativeResult()
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        ready = _READY(on_ready) if on_ready is not None else _READY()
        code = self._lib.optstep_native_step_finish(self._handle, outs, num_outs, ready,
                                                    ctypes.byref(result), error, _ERROR_BYTES)
        if code:
            _raise(code, error, result)
        return _reply(result, params)

    def close(self) -> None:
        """Ends the stream (cancelled unless finished) and lets go of the gradients."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle:
            self._lib.optstep_native_step_close(handle)
            self._client.release()  # the C++ client may go once no stream uses it


def _schedule(groups: Sequence[Tuple[int, Optional[float], Optional[float]]],
              return_ids: Sequence[int]) -> Tuple[Any, Any]:
    group_array = (_Group * len(groups))(*[
        _Group(g, lr is not None, lr or 0.0, wd is not None, wd or 0.0) for g, lr, wd in groups])
    return group_array, (ctypes.c_uint32 * len(return_ids))(*return_ids)


class Connector:
    """The :class:`NativeClient` of a Python client, connected on first use with its settings,
    and again when a session needs ranks the current connection does not know. Thread-safe."""

    def __init__(self, **settings: Any) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._clients: List[NativeClient] = []  # the current one last; all closed by close()
        self._closed = False
        # The step each trainer's state was last replaced at (state_replaced with a trainer),
        # told to each client connected later too: a trainer that attached, or loaded a state,
        # before its first step has no native client yet, which would then miss a rollback.
        self._marks: Dict[Tuple[str, int], int] = {}

    def get(self, rank_targets: Callable[[], Iterable[str]]) -> Optional[NativeClient]:
        """The client over `rank_targets()`; None when the native path is off, or closed (the
        Python path then says so)."""
        if not available():
            return None
        targets = tuple(rank_targets())
        with self._lock:
            if self._closed:
                return None
            if self._clients and self._clients[-1].rank_targets[:len(targets)] == targets:
                return self._clients[-1]
            fresh = NativeClient(targets, **self._settings)
            for (session_id, trainer_id), step in self._marks.items():
                fresh.state_replaced(session_id, step, trainer_id)
            self._clients.append(fresh)
            return fresh

    def state_replaced(self, session_id: str, step: int, trainer_id: Optional[int] = None) -> None:
        """Tells every client connected so far that the session's state was replaced (for
        `trainer_id` alone when given)."""
        with self._lock:
            clients = list(self._clients)
            for key in self._marks:
                if key[0] == session_id and trainer_id in (None, key[1]):
                    self._marks[key] = step
            if trainer_id is not None:
                self._marks[(session_id, trainer_id)] = step
        for client in clients:
            client.state_replaced(session_id, step, trainer_id)

    def forget(self, session_id: str) -> None:
        """The session was closed: its trainers' steps are told to no client connected later."""
        with self._lock:
            self._marks = {k: v for k, v in self._marks.items() if k[0] != session_id}

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
            self._closed = True
        for client in clients:
            client.close()


def out_buffer(buffer: Any, wire: int, numel: int, what: str) -> Any:
    """`buffer` (a numpy array or a torch CPU tensor) checked to take `numel` contiguous
    elements of `wire` (bf16: torch.bfloat16 or uint16 bits); InvalidArgumentError otherwise."""
    if isinstance(buffer, np.ndarray):
        ok = buffer.flags.c_contiguous and buffer.dtype == dtypes.numpy_dtype(wire)
        count = buffer.size
    else:
        import torch

        want = torch.bfloat16 if wire == dtypes.BF16 else torch.float32
        ok = (buffer.device.type == "cpu" and buffer.is_contiguous() and buffer.dtype == want)
        count = buffer.numel()
    if not ok or count != numel:
        raise InvalidArgumentError(f"{what}: output buffer of {count} elements is not "
                                   f"{numel} contiguous CPU {dtypes.dtype_name(wire)} elements")
    return buffer


def checked_outs(layout: SessionLayout, wire: int,
                 param_out: Mapping[int, Any]) -> Mapping[int, Any]:
    """`param_out` with every buffer checked (out_buffer) before anything is sent, whichever
    path the step takes; InvalidArgumentError naming the first that does not fit."""
    for pid, buffer in param_out.items():
        if not 0 <= pid < layout.num_params:
            raise InvalidArgumentError(f"param_out: param_id {pid} is not in the session "
                                       f"({layout.num_params} parameters)")
        param = layout.params[pid]
        out_buffer(buffer, wire, param.numel, f"param '{param.name}'")
    return param_out


def host_view(buffer: Any) -> np.ndarray:
    """A flat numpy view of an output buffer (uint16 bits for a bfloat16 tensor)."""
    if isinstance(buffer, np.ndarray):
        return buffer.reshape(-1)
    flat = buffer.detach().reshape(-1)
    if str(flat.dtype) == "torch.bfloat16":
        import torch

        flat = flat.view(torch.int16)
    view: np.ndarray = flat.numpy()
    return view.view(np.uint16) if view.dtype == np.int16 else view


def write_params(params: Dict[int, np.ndarray], param_out: Mapping[int, Any]) -> None:
    """Copies returned parameters (the pure-Python path's answer) into their output buffers."""
    for pid, buffer in param_out.items():
        values = params.pop(pid, None)
        if values is not None:
            np.copyto(host_view(buffer), values.reshape(-1))


def _add_gradients(call: NativeStep, layout: SessionLayout,
                   slices: Sequence[GradientSlice]) -> None:
    for piece in slices:
        param = layout.param(piece.param)
        offset = int(piece.offset)
        check_range(param, offset, call.add_gradient(param.param_id, offset, piece.values,
                                                     piece.dtype, f"param '{param.name}'"))


def _add_outs(call: NativeStep, layout: SessionLayout, wire: int, return_ids: Sequence[int],
              skip_return: bool, param_out: Mapping[int, Any]) -> Dict[int, np.ndarray]:
    """Output buffers of every returned parameter: `param_out`'s, else new arrays (answered)."""
    params: Dict[int, np.ndarray] = {}
    if skip_return:
        return params
    for pid in (return_ids or range(layout.num_params)):
        param = layout.params[pid]
        if pid in param_out:
            call.add_out(pid, wire,
                         out_buffer(param_out[pid], wire, param.numel, f"param '{param.name}'"))
        else:
            params[pid] = np.empty(param.shape, dtypes.numpy_dtype(wire))
            call.add_out(pid, wire, params[pid])
    return params


def run_step(client: NativeClient, layout: SessionLayout, session_id: str, step: int,
             slices: Sequence[GradientSlice], trainer_id: int,
             groups: Sequence[Tuple[int, Optional[float], Optional[float]]], wire: int,
             return_params: Optional[Sequence[ParamRef]], skip_return: bool,
             param_out: Mapping[int, Any]) -> Reply:
    """One step through the library: answers its result and the returned parameters that have
    no buffer in `param_out` (those with one are written there), shaped, by id."""
    return_ids = layout.param_ids(return_params or ())
    call = NativeStep()
    _add_gradients(call, layout, slices)
    params = _add_outs(call, layout, wire, return_ids, skip_return, param_out)
    result = client.step(session_id, step, trainer_id, groups, wire, return_ids, skip_return,
                         call)
    return _reply(result, params)


def _reply(result: NativeResult, params: Dict[int, np.ndarray]) -> Reply:
    # A skipped step may come back without parameters: nothing changed.
    return Reply(int(result.step), bool(result.skipped), float(result.grad_norm),
                 bool(result.clipped), params if result.params_written else {})
