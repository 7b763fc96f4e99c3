"""Steps through memory shared with the ranks of this host (docs/api.md, "Shared memory").

A rank on the trainer's host shares a segment with it per session and trainer
(AttachSharedMemory): the trainer writes the gradients of the parameters the rank owns there,
the step's stream carries only its header and commit, and the rank writes the updated values
back before it answers. No tensor byte crosses a socket. Internal to the client; thread-safe
for different trainers (each trainer's steps come one at a time).
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import grpc
import numpy as np

from optstep import dtypes, native
from optstep.chunks import GradientSlice, RankContribution
from optstep.errors import NotFoundError, from_rpc_error
from optstep.layout import SessionLayout
from optstep.step_call import exchange_steps
from optstep.v1 import optimizer_service_pb2 as svc_pb2

_ALIGNMENT = 64


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT


class Segment:
    """One rank's segment for one session and trainer, mapped into this process."""

    def __init__(self, answer: svc_pb2.AttachSharedMemoryResponse, layout: SessionLayout,
                 rank: int) -> None:
        """OSError when the segment cannot be opened here (another host, another user) or is
        not the one the rank described."""
        fd = os.open(answer.path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != answer.bytes:
                raise OSError(f"shared memory '{answer.path}' is not {answer.bytes} bytes")
            self._map = mmap.mmap(fd, answer.bytes)
        finally:
            os.close(fd)
        if self._map[:len(answer.token)] != answer.token:
            self._map.close()
            raise OSError(f"shared memory '{answer.path}' is not the rank's segment")
        self.segment_id: int = answer.segment_id
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self._gradients: Dict[int, np.ndarray] = {}
        self._values: Dict[int, np.ndarray] = {}
        span = 0
        for param in layout.params:
            if param.owner != rank:
                continue
            g = answer.gradients_offset + span
            v = answer.parameters_offset + span
            self._gradients[param.param_id] = whole[g:g + 4 * param.numel].view(np.float32)
            self._values[param.param_id] = whole[v:v + 4 * param.numel].view(np.float32)
            span += _aligned(4 * param.numel)
        self.num_elements = sum(a.size for a in self._gradients.values())

    def write_gradient(self, param_id: int, values: Any) -> None:
        """Writes one whole gradient (a numpy array or a CPU torch tensor), widened to fp32."""
        _copy(self._gradients[param_id], values)

    def value(self, param_id: int) -> np.ndarray:
        """The flat fp32 value the rank wrote after the last step (a view of the segment)."""
        return self._values[param_id]

    def close(self) -> None:
        self._gradients.clear()
        self._values.clear()
        try:
            self._map.close()
        except BufferError:  # a view is still alive: the mapping goes with it
            pass


def _copy(into: np.ndarray, values: Any) -> None:
    """Copies `values` (flattened) into `into`, converting as torch or numpy does exactly."""
    if isinstance(values, np.ndarray):
        np.copyto(into, values.reshape(-1), casting="same_kind")
        return
    import torch

    # torch copies with the machine's threads and widens bf16 / fp16 exactly.
    torch.from_numpy(into).copy_(values.detach().reshape(-1))


def on_loopback(target: str) -> bool:
    """Whether gRPC target `target` ("host:port", "ipv4:...", "dns:///host:port", "unix:...")
    names this host's loopback: the only ranks a segment is asked of (a rank elsewhere would
    make one that no process here can open, and hold its bytes until the session closes)."""
    if target.startswith("unix:"):
        return True
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
    host = target.rsplit(":", 1)[0] if not target.endswith("]") else target
    host = host.strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def eligible(layout: SessionLayout, slices: Sequence[GradientSlice], wire: int) -> bool:
    """Whether a step can go through shared memory: fp32 answers, and gradients that are every
    parameter whole, floating-point, sent as their own (or fp32) elements, so that widening
    them into the segment gives the rank the same fp32 values the stream would."""
    if wire != dtypes.FP32 or len(slices) != layout.num_params:
        return False
    seen = set()
    for piece in slices:
        if int(piece.offset) != 0 or not _floating(piece.values):
            return False
        if piece.dtype is not None and piece.dtype not in ("fp32", dtypes.FP32):
            return False
        param = layout.param(piece.param)
        if _numel(piece.values) != param.numel or param.param_id in seen:
            return False
        seen.add(param.param_id)
    return True


def _floating(values: Any) -> bool:
    if isinstance(values, np.ndarray):
        return values.dtype in (np.float32, np.float16, np.float64)
    return bool(getattr(values, "is_floating_point", lambda: False)()) and \
        getattr(getattr(values, "device", None), "type", None) == "cpu"


def _numel(values: Any) -> int:
    return int(values.size) if isinstance(values, np.ndarray) else int(values.numel())


class SharedSegments:
    """The segments of one client, by (session, trainer): one per rank of the layout, attached
    on first use. A session whose ranks cannot all share memory with this process is
    remembered and not tried again while the same targets serve it (a stand-in that refused is
    not asked again; the rank's own process back is)."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._lock = threading.Lock()
        self._segments: Dict[Tuple[str, int], List[Segment]] = {}
        # The ranks' services each key's segments were attached on: given back at close.
        self._services: Dict[Tuple[str, int], Sequence[Any]] = {}
        # session id -> the targets of its ranks when it was refused, and why
        self._refused: Dict[str, Tuple[Tuple[str, ...], str]] = {}

    def get(self, layout: SessionLayout, trainer_id: int, services: Sequence[Any],
            timeout: float, targets: Sequence[str] = ()) -> Optional[List[Segment]]:
        """Every rank's segment (attaching those missing), or None where shared memory is off or
        cannot be used for this session by the ranks at `targets` (then the step goes through
        the stream)."""
        sid = layout.session_id
        key = (sid, trainer_id)
        with self._lock:
            refused = self._refused.get(sid)
            if not self._enabled or (refused is not None and refused[0] == tuple(targets)):
                return None
            segments = self._segments.get(key)
        if segments is not None and len(segments) == len(services):
            return segments
        attached: List[Segment] = []
        try:
            for rank, service in enumerate(services):
                answer = service.AttachSharedMemory(
                    svc_pb2.AttachSharedMemoryRequest(session_id=sid, trainer_id=trainer_id),
                    timeout=timeout)
                attached.append(Segment(answer, layout, rank))
        except grpc.RpcError as e:
            for segment in attached:
                segment.close()
            if e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED,
                            grpc.StatusCode.RESOURCE_EXHAUSTED):
                self._refuse(sid, targets, e.details() or str(e.code()))
                # The ranks that attached before this one refused hold their segments (and
                # count them against their budgets) until they are given back.
                self._release(sid, trainer_id, services[:len(attached)], timeout)
                return None
            # As every other call's error: a rank away (UNAVAILABLE) is waited for by the
            # step's recovery.
            raise from_rpc_error(e) from None
        except OSError as e:  # another pid namespace, or another user's process
            for segment in attached:
                segment.close()
            self._refuse(sid, targets, str(e))
            self._release(sid, trainer_id, services, timeout)
            return None
        with self._lock:
            replaced = self._segments.get(key, [])
            self._segments[key] = attached
            self._services[key] = services
        for segment in replaced:
            segment.close()
        return attached

    @staticmethod
    def _release(session_id: str, trainer_id: int, services: Sequence[Any],
                 timeout: float) -> None:
        """Gives the segments back to the ranks (their bytes count against the budget)."""
        for service in services:
            try:
                service.AttachSharedMemory(svc_pb2.AttachSharedMemoryRequest(
                    session_id=session_id, trainer_id=trainer_id, release=True), timeout=timeout)
            except grpc.RpcError:
                pass  # dropped with the session at the latest

    def _refuse(self, session_id: str, targets: Sequence[str], why: str) -> None:
        with self._lock:
            self._refused[session_id] = (tuple(targets), why)

    def step(self, layout: SessionLayout, services: Sequence[Any], header: svc_pb2.StepHeader,
             slices: Sequence[GradientSlice], skip_return: bool, param_out: Mapping[int, Any],
             *, rpc_timeout: float, stream_timeout: float, wait_for_ready: bool,
             targets: Sequence[str] = ()
             ) -> Optional[Tuple[svc_pb2.StepResult, Dict[int, np.ndarray]]]:
        """One attempt of a step through the segments: the first rank's StepResult and the
        returned values not written into `param_out`. None when the session cannot use shared
        memory (the caller sends the step through the stream). A segment a rank no longer has
        (the rank restarted, or a stand-in serves it) is attached again, once."""
        key = (layout.session_id, header.trainer_id)
        for again in (False, True):
            segments = self.get(layout, header.trainer_id, services, rpc_timeout, targets)
            if segments is None:
                return None
            write_gradients(layout, segments, slices)
            plan = [RankContribution(num_elements=s.num_elements) for s in segments]
            try:
                results = exchange_steps(services, header, plan, None, skip_return, None,
                                         timeout=stream_timeout, wait_for_ready=wait_for_ready,
                                         segments=[s.segment_id for s in segments])
            except NotFoundError as e:
                if again or "shared_memory_segment" not in str(e):
                    raise
                self._forget(key)
                continue
            written = [r for r, result in enumerate(results) if result.params_in_shared_memory]
            params: Dict[int, np.ndarray] = {}
            if not skip_return and written:
                asked = list(header.return_param_ids) or list(range(layout.num_params))
                ids = [pid for pid in asked if layout.params[pid].owner in written]
                params = read_params(layout, segments, ids, param_out)
            return results[0], params
        raise AssertionError("unreachable")

    def _forget(self, key: Tuple[str, int]) -> None:
        with self._lock:
            dropped = self._segments.pop(key, [])
            self._services.pop(key, None)
        for segment in dropped:
            segment.close()

    def drop(self, session_id: str) -> None:
        """Forgets the session's segments (closed)."""
        with self._lock:
            keys = [k for k in self._segments if k[0] == session_id]
            self._refused.pop(session_id, None)
        for key in keys:
            self._forget(key)

    def close(self, timeout: float = 10.0) -> None:
        """Unmaps every segment and gives it back to its rank (each call cut at `timeout`):
        the session may outlive this client (other trainers, a later export), and each segment
        holds twice the trainer's owned parameter bytes of its rank's budget until then."""
        with self._lock:
            attached = dict(self._services)
        for key, services in attached.items():
            self._forget(key)
            self._release(key[0], key[1], services, timeout)


def write_gradients(layout: SessionLayout, segments: Sequence[Segment],
                    slices: Sequence[GradientSlice]) -> None:
    for piece in slices:
        param = layout.param(piece.param)
        segments[param.owner].write_gradient(param.param_id, piece.values)


def read_params(layout: SessionLayout, segments: Sequence[Segment], return_ids: Iterable[int],
                param_out: Mapping[int, Any]) -> Dict[int, np.ndarray]:
    """The values of `return_ids`: written into `param_out`'s buffers (fp32 numpy arrays or CPU
    torch tensors, checked as the other paths do) where given, else copied out."""
    params: Dict[int, np.ndarray] = {}
    for pid in return_ids:
        param = layout.params[pid]
        value = segments[param.owner].value(pid)
        if pid in param_out:
            out = native.out_buffer(param_out[pid], dtypes.FP32, param.numel,
                                    f"param '{param.name}'")
            if isinstance(out, np.ndarray):
                np.copyto(out.reshape(-1), value)
            else:
                import torch

                out.detach().reshape(-1).copy_(torch.from_numpy(value))
        else:
            params[pid] = value.reshape(param.shape).copy()
    return params
