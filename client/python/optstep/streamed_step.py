"""A step whose gradients are given while they are produced (:meth:`optstep.Client.open_step`).

With the native library (optstep.native) each :meth:`StreamedStep.add` queues its gradients on
the ranks' Step streams at once, and gRPC sends them while the caller goes on (e.g. while
backward computes the next gradients); :meth:`StreamedStep.finish` commits and waits for the
step. Without the library, or where the step goes through memory shared with the ranks
(optstep.shared_memory, which copies them faster than a stream sends them), the gradients are
kept and sent by ``finish`` as one :meth:`optstep.Client.step`. All give the same step.

A streamed step does not wait for a recovering group by itself: when its streams fail on the
way (the group lost a rank, a stream was cut), ``finish`` redoes the step with
:meth:`optstep.Client.step` and the same gradients, which waits for the group and is answered
as a replay where the step was applied after all.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence

import grpc

from optstep import dtypes, native
from optstep.chunks import GradientSlice, as_slices
from optstep.errors import OptstepError
from optstep.layout import ParamRef

if TYPE_CHECKING:
    from optstep.client import Client, GroupSchedule, StepReply

__all__ = ["StreamedStep"]

# Codes of a failed stream that Client.step may get past (its recovery, or a replay), or tell
# apart: out of sequence (FAILED_PRECONDITION) is the group restored to an older step (the
# rewind) or the caller's own mistake, and NOT_FOUND a session that the group is restoring.
_REDO = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED,
         grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.NOT_FOUND)


class StreamedStep:
    """One optimizer step of one trainer, fed piece by piece. Thread-safe: :meth:`add` may be
    called from several threads (e.g. autograd's); :meth:`finish` once, after every add."""

    def __init__(self, client: "Client", session_id: str, step: int, *, trainer_id: int,
                 groups: Sequence["GroupSchedule"], return_dtype: dtypes.DTypeLike,
                 return_params: Optional[Sequence[ParamRef]], skip_return: bool,
                 native_client: Optional[native.NativeClient]) -> None:
        self._client = client
        self._session_id = session_id
        self._step = step
        self._trainer_id = trainer_id
        self._groups = list(groups)
        self._return_dtype = return_dtype
        self._return_params = return_params
        self._skip_return = skip_return
        self._layout = client.layout(session_id)
        wire = dtypes.return_dtype(return_dtype)
        self._lock = threading.Lock()
        self._slices: List[GradientSlice] = []  # kept for a redo through Client.step
        self._stream: Optional[native.NativeStepStream] = None
        if native_client is not None:
            self._stream = native.NativeStepStream(
                native_client, self._layout, session_id, step, trainer_id,
                [(g.group_id, g.lr, g.weight_decay) for g in self._groups],
                wire,
                return_params, skip_return)

    @property
    def native(self) -> bool:
        """True when the gradients go out as they are added (the native library)."""
        return self._stream is not None

    def add(self, gradients: Any) -> None:
        """Adds part of this trainer's gradients: whole tensors by id or name, or
        GradientSlices, as :meth:`optstep.Client.step` takes them. Their memory must not change
        until :meth:`finish` has returned."""
        slices = as_slices(self._layout, gradients, "gradient")
        with self._lock:
            self._slices.extend(slices)
        if self._stream is not None:
            self._stream.add(slices)

    def finish(self, param_out: Optional[Mapping[int, Any]] = None,
               on_ready: Optional[Callable[[int], None]] = None) -> "StepReply":
        """Commits the step and waits for it; answers as :meth:`optstep.Client.step` (the
        parameters with a buffer in `param_out` are written there). With the native library
        each buffer is written as its parameter arrives, and `on_ready(param_id)` says when one
        is whole (without it, nothing is called: the step's end says it)."""
        from optstep.client import StepReply

        outs = param_out or {}
        with self._lock:
            slices = list(self._slices)
        if self._stream is not None:
            try:
                reply = StepReply(*self._stream.finish(outs, on_ready))
                # Applied: a later step answered out of sequence is told apart from a restore.
                self._client._recovery.note(self._session_id, reply.step,
                                            trainer_id=self._trainer_id)
                return reply
            except OptstepError as e:
                if e.code not in _REDO:
                    raise
            finally:
                self.close()
        return self._client.step(self._session_id, self._step, slices,
                                 trainer_id=self._trainer_id, groups=self._groups,
                                 return_dtype=self._return_dtype,
                                 return_params=self._return_params,
                                 skip_return=self._skip_return, param_out=outs)

    def close(self) -> None:
        """Ends the step's streams unless finished (nothing is applied then)."""
        if self._stream is not None:
            self._stream.close()
