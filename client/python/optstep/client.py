"""optstep.Client: sessions, optimizer steps, parameters, state dicts and health over gRPC.

The Python counterpart of the C++ ``optstep::Client`` (client/cpp/client.h), and it behaves the
same way: one channel per rank; sessions are asked of rank 0; a step sends this trainer's
gradient chunks to the ranks that own their parameters (SessionInfo.layout), one Step stream per
rank of the layout (header, chunks, commit), and the updated parameters come back from rank
``trainer_id % world_size`` only. Every error is an :class:`optstep.OptstepError` carrying the
gRPC code and message, whether the server answered it or the client found it first::

    with optstep.Client("localhost:50051") as client:
        info, _ = client.create_session(spec)
        client.init_parameters(info.session_id, {"w": w0})
        reply = client.step(info.session_id, step=info.step + 1, gradients={"w": grad})
        w1 = reply.params[0]

Thread-safe: calls may run from several threads at once (each has its own gRPC call).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc

from optstep import dtypes, native, raw_messages, shared_memory, state_dicts
from optstep.channel_credentials import channel_credentials
from optstep.chunks import GradientSlice, ParamAssembler, as_slices, plan_contributions
from optstep.client_types import CreatedSession, Gradients, GroupSchedule, Parameters, StepReply
from optstep.errors import (AWAY_ERRORS, DeadlineExceededError, InternalError,
                            InvalidArgumentError, NotFoundError, OptstepError, OutOfRangeError,
                            UnavailableError, from_rpc_error)
from optstep.layout import ParamRef, SessionLayout
from optstep.rank_channels import RankChannel, RankChannels, deadline_in, timeout_by
from optstep.recovery import StepRecovery
from optstep.session_pages import list_all_sessions, read_session
from optstep.shared_memory import SharedSegments
from optstep.step_call import (check_step, exchange_steps, init_requests, pull_owned, pull_whole,
                               step_header)
from optstep.streamed_step import StreamedStep
from optstep.v1 import (checkpoint_service_pb2 as ckpt_pb2, optimizer_service_pb2 as svc_pb2,
                        session_pb2)

__all__ = ["Client", "CreatedSession", "GroupSchedule", "StepReply", "Parameters",
           "Gradients", "MAX_CHUNK_BYTES"]

#: The server's limit on one chunk's payload.
MAX_CHUNK_BYTES = 4 << 20
_CHUNK_ENVELOPE_BYTES = 1024
# What a unary call answers (_call).
_Response = TypeVar("_Response")


def _call(fn: Callable[..., _Response], *args: Any, **kwargs: Any) -> _Response:
    """Runs a unary gRPC call, converting its error."""
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


class Client:
    """A connection to the ranks of an optstep server group.

    Args:
      target: gRPC target of rank 0, e.g. "localhost:50051".
      rank_targets: target of every rank, by rank; overrides `target`. Without it, ranks beyond
        0 are reached at the addresses the server advertises in the session layout.
      connect_timeout: seconds to wait for every given rank to be reachable (UnavailableError
        otherwise; a rank that a stand-in serves is waited for there); 0 connects lazily on
        the first call.
      rpc_timeout: deadline of unary calls (sessions, health), seconds.
      stream_timeout: deadline of streaming calls (steps, parameters, state dicts), seconds. A
        step waits for every trainer's contribution, so this bounds the slowest trainer too.
      wait_for_ready: calls wait (until their deadline) for a channel that is not ready instead
        of failing at once with UNAVAILABLE.
      max_chunk_bytes: largest tensor payload of one chunk, between 4 bytes and 4 MiB.
      max_message_bytes, stream_lookahead_bytes, max_frame_bytes, bdp_probe: transport tuning
        (docs/design.md §4); the defaults are the measured throughput settings of the C++ client.
      tls: use TLS (implied by tls_ca and tls_cert); the server's certificate is checked
        against tls_ca (a PEM file; None: the system's roots).
      tls_cert, tls_key: PEM client certificate and key, for servers that require one (mutual
        TLS).
      tls_server_name: name to check the server's certificate against instead of the target's
        host.
      token: bearer token sent with every call; needs TLS. None: $OPTSTEP_TOKEN when TLS is on.
      recovery_timeout: seconds a step waits for a recovering group (a failed rank, the group
        restarting and restoring its sessions) before it fails; it then redoes itself or raises
        RewindRequired (optstep.recovery). 0: a step fails at once, as any call.
      shared_memory: steps with ranks on this host go through memory shared with them
        (optstep.shared_memory) where the step allows it; None: unless $OPTSTEP_SHARED_MEMORY
        is 0.
    """

    def __init__(self, target: Optional[str] = None, *,
                 rank_targets: Optional[Sequence[str]] = None,
                 connect_timeout: float = 10.0, rpc_timeout: float = 30.0,
                 stream_timeout: float = 600.0, wait_for_ready: bool = False,
                 max_chunk_bytes: int = MAX_CHUNK_BYTES, max_message_bytes: int = 8 << 20,
                 stream_lookahead_bytes: int = 16 << 20,
                 max_frame_bytes: int = (16 << 20) - 1, bdp_probe: bool = False,
                 tls: bool = False, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, token: Optional[str] = None,
                 recovery_timeout: float = 300.0, shared_memory: Optional[bool] = None) -> None:
        targets = list(rank_targets or ([target] if target else []))
        if not targets or any(not t for t in targets):
            raise InvalidArgumentError("Client: no target (expected \"host:port\"), or an empty "
                                       "rank target")
        if connect_timeout < 0 or rpc_timeout <= 0 or stream_timeout <= 0:
            raise InvalidArgumentError(
                f"Client: connect_timeout {connect_timeout} must be >= 0, rpc_timeout "
                f"{rpc_timeout} and stream_timeout {stream_timeout} > 0")
        if not 4 <= max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise InvalidArgumentError(
                f"Client: max_chunk_bytes {max_chunk_bytes} is outside [4, {MAX_CHUNK_BYTES}]")
        if max_message_bytes < max_chunk_bytes + _CHUNK_ENVELOPE_BYTES:
            raise InvalidArgumentError(
                f"Client: max_message_bytes {max_message_bytes} cannot hold a chunk of "
                f"{max_chunk_bytes} bytes plus its envelope")
        self._recovery = StepRecovery(recovery_timeout)
        if shared_memory is None:
            shared_memory = os.environ.get("OPTSTEP_SHARED_MEMORY", "1") != "0"
        self._shared = SharedSegments(shared_memory)
        self._rpc_timeout = rpc_timeout
        self._stream_timeout = stream_timeout
        self._wait_for_ready = wait_for_ready
        self._max_chunk_bytes = max_chunk_bytes
        self._channel_options: List[Tuple[str, Union[int, str]]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.http2.bdp_probe", 1 if bdp_probe else 0),
            ("grpc.http2.lookahead_bytes", stream_lookahead_bytes),
            ("grpc.http2.max_frame_size", max_frame_bytes),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if recovery_timeout > 0:  # a restarted rank is found again within a second
            self._channel_options += [("grpc.initial_reconnect_backoff_ms", 100),
                                      ("grpc.min_reconnect_backoff_ms", 100),
                                      ("grpc.max_reconnect_backoff_ms", 1000)]
        tls = tls or bool(tls_ca or tls_cert)
        self._credentials = channel_credentials(tls, tls_ca, tls_cert, tls_key, token)
        if tls_server_name:
            self._channel_options.append(("grpc.ssl_target_name_override", tls_server_name))
        self._lock = threading.Lock()
        self._layouts: Dict[str, SessionLayout] = {}
        self._native = native.Connector(  # the data path of steps, connected on first use
            connect_timeout=connect_timeout, rpc_timeout=rpc_timeout,
            stream_timeout=stream_timeout, recovery_timeout=recovery_timeout,
            wait_for_ready=wait_for_ready, max_message_bytes=max_message_bytes,
            stream_lookahead_bytes=stream_lookahead_bytes, max_frame_bytes=max_frame_bytes,
            bdp_probe=bdp_probe, max_chunk_bytes=max_chunk_bytes, tls=tls, tls_ca=tls_ca,
            tls_cert=tls_cert, tls_key=tls_key, tls_server_name=tls_server_name, token=token)
        self._recovery.on_restart = self._native.state_replaced  # it keeps marks of its own
        self._ranks = RankChannels(targets, explicit=rank_targets is not None,
                                   open_channel=self._open_channel)
        if connect_timeout > 0:
            try:
                self._ranks.connect(connect_timeout, self._rpc_timeout)
            except UnavailableError:
                self.close()
                raise

    # ---- lifetime

    def close(self) -> None:
        """Gives the ranks their shared memory back, closes every channel; then unusable."""
        self._shared.close(self._rpc_timeout)
        self._ranks.close()
        self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def num_ranks(self) -> int:
        """Number of ranks this client has a channel to."""
        return len(self._ranks.given())

    def _open_channel(self, target: str) -> grpc.Channel:
        if self._credentials is not None:
            return grpc.secure_channel(target, self._credentials, options=self._channel_options)
        return grpc.insecure_channel(target, options=self._channel_options)

    def _rank0(self) -> RankChannel:
        return self._ranks.rank0()

    def _following(self, call: Callable[[], _Response], reached: Callable[[], List[str]],
                   deadline: Optional[float] = None) -> _Response:
        """`call()`, again when unavailable (late, with wait_for_ready) and a rank it reaches
        (`reached()`: targets) moved; the look-up ends by `deadline` (monotonic; None: none)."""
        before = reached()
        try:
            return call()
        except AWAY_ERRORS as e:
            if isinstance(e, DeadlineExceededError) and not self._wait_for_ready:
                raise
            if not self._ranks.look_up_rank0(self._rpc_timeout, deadline) or reached() == before:
                raise
        return call()

    def _on_rank0(self, call: Callable[[RankChannel], _Response],
                  deadline: Optional[float] = None) -> _Response:
        """`call` on rank 0 where it is served now (_following)."""
        return self._following(lambda: call(self._rank0()), lambda: [self._rank0().target],
                               deadline)

    def _unary_kwargs(self, deadline: Optional[float] = None) -> Dict[str, Any]:
        return {"timeout": timeout_by(self._rpc_timeout, deadline),
                "wait_for_ready": self._wait_for_ready}

    # ---- sessions (asked of rank 0; the answers refresh the cached layouts)

    def create_session(self, spec: session_pb2.SessionSpec) -> CreatedSession:
        """Registers a model, or attaches to the existing session of the same name and
        definition. A retry after a lost answer sends the same random request id: no 2nd session."""
        request = svc_pb2.CreateSessionRequest(spec=spec, request_id=os.urandom(16).hex())
        response = self._on_rank0(lambda rank: _call(rank.service.CreateSession, request,
                                                     **self._unary_kwargs()))
        # The answer is a summary: the layout comes in GetSession's pages.
        return CreatedSession(self.get_session(response.summary.session_id), response.attached)

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        """The whole SessionInfo (every parameter and owner), read in GetSession's pages; all of
        its calls end within `timeout` seconds when given (else each within rpc_timeout)."""
        deadline = deadline_in(timeout)
        info = read_session(session_id, lambda request: self._on_rank0(lambda rank: _call(
            rank.service.GetSession, request, **self._unary_kwargs(deadline)), deadline))
        self._remember(info)
        return info

    def list_sessions(self, page_size: int = 0) -> List[session_pb2.SessionSummary]:
        """The summaries of every session the caller may see, by id, read `page_size` (0: the
        server's default) at a time."""
        return list_all_sessions(lambda request: self._on_rank0(lambda rank: _call(
            rank.service.ListSessions, request, **self._unary_kwargs())), page_size)

    def close_session(self, session_id: str) -> None:
        """Drops the session, its parameters and state on the server. Made once more where rank 0
        is served now after an attempt that got no answer, NOT_FOUND means that one closed it."""
        request = svc_pb2.CloseSessionRequest(session_id=session_id)
        tried: List[RankChannel] = []

        def close(rank: RankChannel) -> Any:
            tried.append(rank)
            return _call(rank.service.CloseSession, request, **self._unary_kwargs())
        try:
            self._on_rank0(close)
        except NotFoundError:
            if len(tried) < 2:
                raise
        with self._lock:
            self._layouts.pop(session_id, None)
        self._shared.drop(session_id)
        self._native.forget(session_id)

    def layout(self, session_id: str, refresh: bool = False) -> SessionLayout:
        """The session's parameters and owner ranks (cached; `refresh` asks again)."""
        if not refresh:
            with self._lock:
                cached = self._layouts.get(session_id)
            if cached is not None:
                return cached
        return self._remember(self.get_session(session_id))

    def _remember(self, info: session_pb2.SessionInfo) -> SessionLayout:
        layout = SessionLayout.from_session_info(info)
        self._ranks.follow_stand_ins(layout)
        with self._lock:
            self._layouts[info.session_id] = layout
        return layout

    # ---- parameters

    def init_parameters(self, session_id: str, values: Gradients) -> int:
        """Sets initial values (any dtype; whole tensors or slices) before the first step.

        Under REPLICATED storage every rank of the layout holds every master, so every rank
        receives all the values; under OWNERS each rank those it owns. FailedPreconditionError
        after the first step (also once a rank applied its part of step 1 before a lost rank
        interrupted it). Refused UNAVAILABLE (a group that heals, a rank not reached; nothing
        written), they are sent again with backoff, where each rank is served now, for up to
        `recovery_timeout` (an attempt runs to its stream_timeout). Answers the elements written.
        """
        layout = self.layout(session_id)
        slices = as_slices(layout, values, "initial values")
        plan = plan_contributions(layout, slices, self._max_chunk_bytes)
        chunks = [chunk for contribution in plan for chunk in contribution.chunks]
        total = sum(c.data.size for c in chunks)

        def send() -> int:
            for r in range(layout.world_size):
                mine = list(plan[r].chunks) if layout.owners_only else chunks
                if not mine:
                    continue
                # Sent again where rank r is served now if it moved (a stand-in).
                response = self._following(
                    lambda: _call(self._ranks.reach(layout)[r].service.InitParameters,
                                  init_requests(session_id, mine), timeout=self._stream_timeout,
                                  wait_for_ready=self._wait_for_ready),
                    lambda: [self._ranks.reach(layout)[r].target])
                expected = sum(c.data.size for c in mine)
                if response.elements != expected:
                    raise InternalError(f"session '{session_id}': rank {r} wrote "
                                        f"{response.elements} of {expected} initial values")
            return total

        # Refused while the group heals (nothing written): sent again to every rank once it serves.
        return self._recovery.run_while_unavailable(send)

    def pull_parameters(self, session_id: str, dtype: dtypes.DTypeLike = "fp32",
                        params: Optional[Sequence[ParamRef]] = None, *,
                        timeout: Optional[float] = None) -> Parameters:
        """The current parameters (`params`, or all) in fp32 or bf16, after the last step; the
        pull's streams within `timeout` seconds when given (each within stream_timeout; the
        session's layout, when not known yet, is read first)."""
        wire = dtypes.return_dtype(dtype)
        layout = self.layout(session_id)
        ids = layout.param_ids(params or ())
        request = svc_pb2.PullParametersRequest(session_id=session_id, dtype=wire, param_ids=ids)
        timeout, ready, deadline = self._stream_timeout, self._wait_for_ready, deadline_in(timeout)
        if not layout.owners_only:
            # REPLICATED storage: rank 0 holds every parameter (a client of one target asks it).
            return self._on_rank0(lambda rank: pull_whole(
                rank, request, layout, wire, ids, timeout=timeout_by(timeout, deadline),
                wait_for_ready=ready), deadline)
        # OWNERS: each owner its own; begun again in whole where an owner away moved.
        return self._following(
            lambda: pull_owned(self._ranks.reach(layout), request, layout, wire, ids,
                               timeout=timeout, wait_for_ready=ready, deadline=deadline),
            lambda: [r.target for r in self._ranks.reach(layout)], deadline)

    # ---- steps

    def step(self, session_id: str, step: int, gradients: Gradients, *, trainer_id: int = 0,
             groups: Optional[Iterable[GroupSchedule]] = None,
             return_dtype: dtypes.DTypeLike = "fp32",
             return_params: Optional[Sequence[ParamRef]] = None,
             skip_return: bool = False,
             param_out: Optional[Mapping[int, Any]] = None) -> StepReply:
        """One optimizer step of trainer `trainer_id`.

        `gradients` are this trainer's whole contribution to step number `step` (= the session's
        step + 1): whole tensors keyed by parameter id or name, or GradientSlices (SHARDED
        trainers send ranges). Each goes as its own dtype (fp32, bf16, fp16) unless a slice asks
        for another. Validated here (InvalidArgumentError, NotFoundError) before anything is
        sent; then one stream per rank of the layout. Blocks until every trainer has committed
        and the step has run. `groups` set this step's lr / weight decay per group (unnamed
        groups keep their defaults). The updated parameters (`return_params`, or all) come
        back in `return_dtype` (fp32 or bf16) unless `skip_return`; those with a buffer in
        `param_out` (by id: contiguous numpy array or CPU torch tensor of the return dtype, e.g.
        the model's own) are written there instead.

        With the native library (optstep.native) the step runs in C++, tensors read and written
        by pointer; without it (or with OPTSTEP_NATIVE=0) in Python, with the same results.

        Raises FailedPreconditionError for a step out of sequence, AbortedError when the step
        was aborted (redo it), DeadlineExceededError after `stream_timeout`. Retrying the same
        (session, step, trainer) is safe. While the group recovers, the step waits for it (up to
        `recovery_timeout`) and redoes itself with the same bytes; RewindRequired when the
        session came back at an older step than `step` - 1.
        """
        check_step(session_id, step)
        wire = dtypes.return_dtype(return_dtype)
        # Kept until the step is applied: every attempt sends the same bytes.
        slices = as_slices(self.layout(session_id), gradients, "gradient")
        groups = list(groups or ())
        outs = native.checked_outs(self.layout(session_id), wire, param_out or {})
        if shared_memory.eligible(self.layout(session_id), slices, wire):
            shared = self._step_shared(session_id, step, slices, trainer_id, groups,
                                       return_params, skip_return, outs)
            if shared is not None:
                return shared
        native_client = self._native_client(session_id)
        if native_client is not None:
            return StepReply(*native.run_step(
                native_client, self.layout(session_id), session_id, step, slices, trainer_id,
                [(g.group_id, g.lr, g.weight_decay) for g in groups], wire, return_params,
                skip_return, outs))

        def attempt() -> StepReply:
            return self._step_once(session_id, step, slices, trainer_id, groups, wire,
                                   return_params, skip_return)

        return self._recover(session_id, step, trainer_id, attempt, wire, return_params,
                             skip_return, outs)

    def _recover(self, session_id: str, step: int, trainer_id: int,
                 attempt: Callable[[], StepReply], wire: dtypes.WireDType,
                 return_params: Optional[Sequence[ParamRef]], skip_return: bool,
                 outs: Mapping[int, Any]) -> StepReply:
        """Runs `attempt` until the step is applied, through a recovery of the group."""

        def applied(timeout: float) -> StepReply:  # an earlier step's values: run() rewinds
            pulled = Parameters(step, {}) if skip_return else self.pull_parameters(
                session_id, wire, return_params, timeout=timeout)
            return StepReply(pulled.step, False, float("nan"), False, pulled.params)

        reply: StepReply = self._recovery.run(self, session_id, step, attempt, applied,
                                              trainer_id=trainer_id, step_of=lambda r: r.step)
        native.write_params(reply.params, outs)
        return reply

    def _shares_memory(self, session_id: str, trainer_id: int) -> bool:
        """Whether the session's ranks share memory with this process for `trainer_id`'s steps
        (attaching their segments on first use): ranks on loopback that agreed. Not while a rank
        is away (or wedged, or stopping) or has yet to restore the session: the step then goes
        through a path whose recovery waits for the group, and a later step attaches."""
        layout = self.layout(session_id)
        ranks = self._ranks.reach(layout)
        if not all(shared_memory.on_loopback(rank.target) for rank in ranks):
            return False
        try:
            return self._shared.get(layout, trainer_id, [rank.service for rank in ranks],
                                    self._rpc_timeout, [rank.target for rank in ranks]) is not None
        except (NotFoundError, *AWAY_ERRORS):
            return False

    def _step_shared(self, session_id: str, step: int, slices: List[GradientSlice],
                     trainer_id: int, groups: List[GroupSchedule],
                     return_params: Optional[Sequence[ParamRef]], skip_return: bool,
                     outs: Mapping[int, Any]) -> Optional[StepReply]:
        """:meth:`step` through shared memory; None when the session's ranks cannot share
        memory with this process (nothing was sent)."""
        if not self._shares_memory(session_id, trainer_id):
            return None
        return_ids = self.layout(session_id).param_ids(return_params or ())

        def attempt() -> StepReply:
            now = self.layout(session_id)
            header = step_header(session_id, step, trainer_id, groups, dtypes.FP32, return_ids)
            ranks = self._ranks.reach(now)
            done = self._shared.step(now, [rank.service for rank in ranks],
                                     header, slices, skip_return, outs,
                                     rpc_timeout=self._rpc_timeout,
                                     stream_timeout=self._stream_timeout,
                                     wait_for_ready=self._wait_for_ready,
                                     targets=[rank.target for rank in ranks])
            if done is None:  # a rank that replaced its segment no longer shares memory
                return self._step_once(session_id, step, slices, trainer_id, groups,
                                       dtypes.FP32, return_params, skip_return)
            result, params = done
            return StepReply(result.step, result.skipped, result.grad_norm, result.clipped, params)

        return self._recover(session_id, step, trainer_id, attempt, dtypes.FP32, return_params,
                             skip_return, outs)

    def open_step(self, session_id: str, step: int, *, trainer_id: int = 0,
                  groups: Optional[Iterable[GroupSchedule]] = None,
                  return_dtype: dtypes.DTypeLike = "fp32",
                  return_params: Optional[Sequence[ParamRef]] = None,
                  skip_return: bool = False) -> StreamedStep:
        """Step `step` of :meth:`step`, its gradients added while they are produced (e.g. by
        backward hooks): see :class:`optstep.streamed_step.StreamedStep`."""
        check_step(session_id, step)
        # Through shared memory the gradients are kept and written into the segment by finish:
        # a copy that takes less than sending them while they are produced.
        shared = dtypes.return_dtype(return_dtype) == dtypes.FP32 and \
            self._shares_memory(session_id, trainer_id)
        return StreamedStep(self, session_id, step, trainer_id=trainer_id,
                            groups=list(groups or ()), return_dtype=return_dtype,
                            return_params=return_params, skip_return=skip_return,
                            native_client=None if shared else self._native_client(session_id))

    def _native_client(self, session_id: str) -> Optional[native.NativeClient]:
        layout = self.layout(session_id)  # the C++ client over its ranks; None without the library
        # As configured: the C++ client follows the stand-ins itself. A group away when it
        # connects: this step goes through the Python path, whose recovery waits for the group.
        try:
            return self._native.get(lambda: [rank.target for rank in self._ranks.of(layout)])
        except (UnavailableError, DeadlineExceededError):
            return None

    def _step_once(self, session_id: str, step: int, slices: List[GradientSlice],
                   trainer_id: int, groups: List[GroupSchedule], wire: dtypes.WireDType,
                   return_params: Optional[Sequence[ParamRef]],
                   skip_return: bool) -> StepReply:
        """One attempt of :meth:`step`, laid out on the session's current layout."""
        layout = self.layout(session_id)
        return_ids = layout.param_ids(return_params or ())
        plan = plan_contributions(layout, slices, self._max_chunk_bytes)
        ranks = self._ranks.reach(layout)
        header = step_header(session_id, step, trainer_id, groups, wire, return_ids)

        assembler = ParamAssembler(layout, wire, return_ids)
        results = exchange_steps([rank.service for rank in ranks], header, plan,
                                 None if layout.owners_only else trainer_id % layout.world_size,
                                 skip_return, assembler, timeout=self._stream_timeout,
                                 wait_for_ready=self._wait_for_ready)
        first = results[0]
        # A skipped step may come back without parameters: nothing changed.
        nothing_changed = first.skipped and assembler.chunks_added == 0
        params = {} if skip_return or nothing_changed else assembler.finish()
        return StepReply(first.step, first.skipped, first.grad_norm, first.clipped, params)

    # ---- checkpoints and state dicts (CheckpointService on rank 0, where it is served now)

    def save_checkpoint(self, session_id: str, name: str,
                        on_progress: Optional[Callable[[Any], None]] = None
                        ) -> ckpt_pb2.CheckpointProgress:
        """Saves the session's state under the server's checkpoint root as `name`; answers the
        last progress message (its `step` is the step captured)."""
        request = ckpt_pb2.SaveRequest(session_id=session_id, name=name)
        return self._on_rank0(lambda rank: state_dicts.follow_progress(
            rank.checkpoint.Save, request, on_progress, self._stream_timeout, self._wait_for_ready))

    def load_checkpoint(self, session_id: str, name: str,
                        on_progress: Optional[Callable[[Any], None]] = None
                        ) -> ckpt_pb2.CheckpointProgress:
        """Restores checkpoint `name` into the session (re-partitioned onto the current ranks)."""
        request = ckpt_pb2.LoadRequest(session_id=session_id, name=name)
        last = self._on_rank0(lambda rank: state_dicts.follow_progress(
            rank.checkpoint.Load, request, on_progress, self._stream_timeout, self._wait_for_ready))
        self.state_replaced(session_id, last.step)  # the step restored
        with self._lock:  # its counters changed: read again at its next use
            self._layouts.pop(session_id, None)
        return last

    def export_state_dict(self, session_id: str, model_chunks: Optional[Sequence[int]] = None,
                          layout: str = "merged", chunk_prefix: str = "") -> Dict[str, Any]:
        """The optimizer state dict: merged, or only the model chunks asked for. Keys follow
        docs/design.md §5: "param/<name>" (fp32 masters) and "state/<sub-optimizer>/<name>/<key>";
        values are shaped arrays in the dtype the server sent (uint16 bits for bf16), scalar
        counters as 0-d arrays. `layout` "by_model_chunk" nests them as ``{chunk_key: {key:
        array}}``, "by_sub_optimizer" as ``{sub_optimizer: {chunk_key: {key: array}}}``
        (optstep.state_dicts); `chunk_prefix` "model" (default) or "model_" names the chunks."""
        request = ckpt_pb2.ExportStateDictRequest(
            session_id=session_id, model_chunks=list(model_chunks or ()),
            layout=state_dicts.layout_of(layout), chunk_prefix=chunk_prefix)
        return self._on_rank0(lambda rank: state_dicts.read_export(
            rank.checkpoint.ExportStateDict, request, layout, self._stream_timeout,
            self._wait_for_ready))

    def import_state_dict(self, session_id: str,
                          state: Mapping[str, Any]) -> ckpt_pb2.ImportStateDictResponse:
        """Replaces the optimizer state (and masters, for "param/..." keys) with `state`, a
        mapping like the ones :meth:`export_state_dict` answers, in any layout (numpy arrays or
        torch tensors; uint16 arrays are bf16 bits, other integers int64 counters). Answers the
        number of tensors and bytes the server took."""
        response: ckpt_pb2.ImportStateDictResponse = self._on_rank0(lambda rank: _call(
            rank.checkpoint.ImportStateDict,
            state_dicts.import_chunks(session_id, state, self._max_chunk_bytes),
            timeout=self._stream_timeout, wait_for_ready=self._wait_for_ready))
        # The state replaced: what the trainers saw applied is gone. (A server of an earlier
        # release does not answer the step; the import stands if it cannot be read now.)
        with contextlib.suppress(OptstepError):
            self.state_replaced(session_id, response.step if response.HasField("step")
                                else self.get_session(session_id).step)
        return response

    def state_replaced(self, session_id: str, step: int, trainer_id: Optional[int] = None) -> None:
        """The session is at `step` (a load, import or rollback): steps seen after it are gone."""
        self._recovery.restart(session_id, step, trainer_id)

    # ---- operations (AdminService; an admin token where the server checks tokens)

    def shutdown(self, rank: int = 0, reason: str = "") -> None:
        """Shuts rank `rank` down as SIGTERM does: it takes no new steps, the running step
        finishes or is cut at its grace period, and the process exits. OutOfRangeError for a
        rank this client has no channel to."""
        ranks = self._ranks.given()
        if not 0 <= rank < len(ranks):
            raise OutOfRangeError(f"rank {rank} is not one of the {len(ranks)} ranks of this "
                                  "client")
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ranks[rank].channel.unary_unary(
            raw_messages.ADMIN_SHUTDOWN)
        _call(call, raw_messages.string_message(reason), **self._unary_kwargs())

    # ---- health

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        """True when `service` ("" = the whole server) on rank 0 is SERVING, False when not.
        When rank 0 does not answer SERVING, the other ranks are asked where it is served now
        (a stand-in, or its own process back) and that one is checked. All of its calls end
        within `timeout` seconds when given (else each within rpc_timeout)."""
        request = raw_messages.string_message(service)
        deadline = deadline_in(timeout)

        def check(rank: RankChannel) -> bool:
            call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = rank.channel.unary_unary(
                raw_messages.HEALTH_CHECK)
            return raw_messages.serving(_call(call, request,
                                              timeout=timeout_by(self._rpc_timeout, deadline)))

        try:
            if check(self._rank0()):
                return True
        except AWAY_ERRORS:  # away, or wedged
            if not self._ranks.look_up_rank0(self._rpc_timeout, deadline):
                raise
            return check(self._rank0())
        return self._ranks.look_up_rank0(self._rpc_timeout, deadline) and check(self._rank0())

