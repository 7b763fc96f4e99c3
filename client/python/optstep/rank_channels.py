"""The channels of a client to the ranks of its group: those it was given (or the ranks
advertise, when it was given rank 0's only), and the stand-ins the group tells of
(docs/deploy.md, "A rank that does not return"). Internal to the client. Thread-safe."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import grpc

from optstep import raw_messages
from optstep.errors import FailedPreconditionError, UnavailableError
from optstep.layout import SessionLayout
from optstep.v1 import checkpoint_service_pb2_grpc as ckpt_grpc
from optstep.v1 import optimizer_service_pb2 as svc_pb2
from optstep.v1 import optimizer_service_pb2_grpc as svc_grpc


# What a health call that did not reach its rank ends with (with wait_for_ready, a channel that
# never connected ends at the deadline).
_NOT_REACHED = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED)
# The least a rank's health call waits (a rank asked after the deadline passed, behind one that
# did not answer, still gets to answer), and the pause before a rank whose call ended unanswered
# is asked again, in seconds.
_LEAST_WAIT = 0.2
_ASK_AGAIN_AFTER = 0.05


def deadline_in(timeout: Optional[float]) -> Optional[float]:
    """The time.monotonic() `timeout` seconds from now; None for None (no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


def timeout_by(rpc_timeout: float, deadline: Optional[float]) -> float:
    """The timeout of one call made by `deadline` (time.monotonic(); None: none): `rpc_timeout`,
    or less where the deadline is nearer (at least 1 ms, so that a call past it fails at once)."""
    if deadline is None:
        return rpc_timeout
    return min(rpc_timeout, max(0.001, deadline - time.monotonic()))


@dataclasses.dataclass
class RankChannel:
    """One channel to one rank, and its stubs."""

    target: str
    channel: grpc.Channel
    service: svc_grpc.OptimizerServiceStub
    checkpoint: ckpt_grpc.CheckpointServiceStub


class RankChannels:
    """The ranks' channels, opened by `open_channel` (the client's credentials and options).

    `explicit`: the targets name every rank; otherwise ranks beyond them are reached at the
    addresses the layouts advertise, opened on first use."""

    def __init__(self, targets: Sequence[str], explicit: bool,
                 open_channel: Callable[[str], grpc.Channel]) -> None:
        self._open_channel = open_channel
        self._explicit = explicit
        self._lock = threading.Lock()
        self._ranks: List[RankChannel] = [self._open(t) for t in targets]
        self._given = len(targets)  # the ranks beyond are reached where the group advertises
        # The stand-ins the group last told of, by rank: each replaces the rank's channel until
        # the rank's own process is back.
        self._stand_ins: Dict[int, RankChannel] = {}
        self._closed = False  # close(): no channel is opened again

    def _open(self, target: str) -> RankChannel:
        channel = self._open_channel(target)
        return RankChannel(target, channel, svc_grpc.OptimizerServiceStub(channel),
                           ckpt_grpc.CheckpointServiceStub(channel))

    def close(self) -> None:
        """Closes every channel; no rank is reached afterwards."""
        with self._lock:
            ranks, self._ranks = self._ranks, []
            ranks += self._stand_ins.values()
            self._stand_ins = {}
            self._closed = True
        for rank in ranks:
            rank.channel.close()

    def connect(self, timeout: float, rpc_timeout: float) -> None:
        """Waits for every given rank (UnavailableError naming the first not reached). A rank
        may be stood in for (docs/deploy.md, "A rank that does not return"), its own address
        answering nothing: the first rank to answer says where the group serves it, and the
        rank is then served by whichever answers first, its stand-in or its own process (back
        while the group still lists the stand-in). A rank still not reached within `timeout` is
        looked up once more: rank 0 says where (for rank 0, the first rank reached does)."""
        ranks = self.given()
        deadline = time.monotonic() + timeout
        if len(ranks) > 1:
            first = _first_ready(ranks, deadline)
            if first is not None:
                try:
                    told = _directory(ranks[first],
                                      min(rpc_timeout, max(0.0, deadline - time.monotonic())))
                    self.follow(list(told.rank_targets), told.stood_in_ranks)
                except grpc.RpcError:
                    pass  # a group still forming may not say: looked up again below
        unreachable = []
        for r, rank in enumerate(ranks):
            # Told of a stand-in, the rank is served by whichever answers first.
            serving = [rank] + [s for s in [self.stand_in(r)] if s is not None]
            first = _first_ready(serving, deadline)
            if first is None:
                unreachable.append(r)
            elif first == 0 and len(serving) > 1:
                self._forget_stand_in(r)
        if unreachable:
            self._connect_stand_ins(ranks, unreachable, timeout, rpc_timeout)

    def _connect_stand_ins(self, ranks: List[RankChannel], unreachable: List[int],
                           timeout: float, rpc_timeout: float) -> None:
        """After `connect` could not reach `unreachable` within `timeout`: asks rank 0 where
        the group serves them (for rank 0, the first rank reached) and waits for those."""

        def not_reached(r: int, why: str = "") -> UnavailableError:
            return UnavailableError(f"cannot connect to rank {r} at '{ranks[r].target}' "
                                    f"within {timeout:g} s{why}")

        # Rank 0 knows whether the group serves a rank elsewhere; any other rank knows it of
        # rank 0.
        asked = next((r for r in range(len(ranks)) if r not in unreachable), None)
        if asked is None:
            raise not_reached(0)
        try:
            told = _directory(self.stand_in(asked) or ranks[asked], rpc_timeout)
        except grpc.RpcError as e:
            raise not_reached(unreachable[0], f", and rank {asked} could not say where it is: "
                              f"{e.details()}") from None
        self.follow(list(told.rank_targets), told.stood_in_ranks)
        deadline = time.monotonic() + timeout
        for r in unreachable:
            stand_in = self.stand_in(r)
            if stand_in is None:
                raise not_reached(r, ", and no stand-in serves it")
            if _first_ready([stand_in], deadline) is None:
                raise not_reached(r, f", nor its stand-in at '{stand_in.target}'")

    def _forget_stand_in(self, rank: int) -> None:
        """The rank is reached at its own channel again."""
        with self._lock:
            stand_in = self._stand_ins.pop(rank, None)
        if stand_in is not None:
            stand_in.channel.close()

    def given(self) -> List[RankChannel]:
        """The channels of the ranks as given or opened so far, by rank."""
        with self._lock:
            return list(self._ranks)

    def rank0(self) -> RankChannel:
        """The channel that reaches rank 0 now: its stand-in's while one serves it."""
        with self._lock:
            if not self._ranks:
                raise FailedPreconditionError("Client: closed")
            return self._stand_ins.get(0, self._ranks[0])

    def look_up_rank0(self, rpc_timeout: float, deadline: Optional[float] = None) -> bool:
        """Rank 0 does not answer, or is not serving: asks every other rank, then rank 0's own
        address, where rank 0 is served now (a stand-in, or its own process back) and follows the
        first answer. False when none answered. (A process of rank 0 that is back but has not
        healed itself in yet knows no stand-in: it is asked last.) Each call waits `rpc_timeout`
        at most, and not past `deadline` (time.monotonic()) when given."""
        self.rank0()  # FailedPreconditionError once closed
        ranks = self.given()
        with self._lock:
            ranks = [self._stand_ins.get(r, rank) for r, rank in enumerate(ranks) if r > 0] + \
                [ranks[0]]
        for rank in ranks:
            try:
                told = _directory(rank, timeout_by(rpc_timeout, deadline))
            except grpc.RpcError:
                continue
            self.follow(list(told.rank_targets), told.stood_in_ranks)
            return True
        return False

    def of(self, layout: SessionLayout) -> List[RankChannel]:
        """The channels of every rank of `layout` as given, opening advertised ones on first
        use."""
        with self._lock:
            if self._closed:
                raise FailedPreconditionError("Client: closed")
            have = len(self._ranks)
            if have < layout.world_size and not self._explicit and \
                    len(layout.rank_targets) >= layout.world_size:
                self._ranks += [self._open(t) for t in layout.rank_targets[have:layout.world_size]]
            if len(self._ranks) < layout.world_size:
                raise FailedPreconditionError(
                    f"session '{layout.session_id}' is laid out over {layout.world_size} ranks "
                    f"but this client knows {len(self._ranks)} (rank_targets)")
            return self._ranks[:layout.world_size]

    def reach(self, layout: SessionLayout) -> List[RankChannel]:
        """The channels that reach every rank of `layout` now: a stand-in's where one stands in
        for the rank, else as :meth:`of`."""
        ranks = self.of(layout)
        with self._lock:
            return [self._stand_ins.get(r, rank) for r, rank in enumerate(ranks)]

    def follow_stand_ins(self, layout: SessionLayout) -> None:
        """Opens a channel to each stand-in `layout` tells of; drops those of ranks back."""
        self.follow(layout.rank_targets, layout.stood_in_ranks)

    def stand_in(self, rank: int) -> Optional[RankChannel]:
        """The channel of the stand-in serving `rank` now, if the group told of one."""
        with self._lock:
            return self._stand_ins.get(rank)

    def follow(self, rank_targets: Sequence[str], stood_in_ranks: Iterable[int]) -> None:
        """Follows the stand-ins the group tells of (a layout, a ListSessions answer): opens a
        channel to each new one, drops those of ranks back. A rank reached where the group
        advertises it (not given) and not stood in is reached at its advertised address from now
        on: the first one seen may have been its stand-in's, or its process may be back
        elsewhere. A rank back from its stand-in gets a new channel to its address: the one it
        had may sit out gRPC's reconnect backoff from when nothing answered there, failing calls
        at once meanwhile."""
        told = {r: rank_targets[r] for r in stood_in_ranks if 0 <= r < len(rank_targets)}
        with self._lock:
            gone = [r for r, rank in self._stand_ins.items() if told.get(r) != rank.target]
            for r in gone:
                del self._stand_ins[r]  # its channel closes once no call uses it
                if r < len(self._ranks) and r not in told:
                    self._ranks[r] = self._open(self._ranks[r].target)
            for r, target in told.items():
                if r not in self._stand_ins:
                    self._stand_ins[r] = self._open(target)
            if self._explicit:
                return
            for r in range(self._given, min(len(self._ranks), len(rank_targets))):
                if r not in told and rank_targets[r] and rank_targets[r] != self._ranks[r].target:
                    self._ranks[r] = self._open(rank_targets[r])


def _first_ready(ranks: Sequence[RankChannel], deadline: float) -> Optional[int]:
    """The first of `ranks` to answer its health service by `deadline` (time.monotonic()), an
    answer of any kind (its channel connected); None when none does. Each call waits for its
    channel to connect (wait_for_ready), at least _LEAST_WAIT even past the deadline; one that
    ends unanswered before the deadline (its connection dropped) is made again. The calls left
    are cancelled. (A call, unlike a watch of the channel's state, leaves no gRPC thread that a
    close of the channel right after would make raise.)"""
    answered: "queue.Queue[int]" = queue.Queue()

    def ask(r: int) -> Any:  # a grpc.Call and a grpc.Future
        check: grpc.UnaryUnaryMultiCallable[bytes, bytes] = ranks[r].channel.unary_unary(
            raw_messages.HEALTH_CHECK)
        call = check.future(raw_messages.string_message(""),
                            timeout=max(_LEAST_WAIT, deadline - time.monotonic()),
                            wait_for_ready=True)
        call.add_done_callback(lambda _: answered.put(r))
        return call

    calls: List[Any] = []
    try:
        for r in range(len(ranks)):
            calls.append(ask(r))
        while True:
            try:
                r = answered.get(timeout=max(0.0, deadline - time.monotonic()) + _LEAST_WAIT)
            except queue.Empty:
                return None
            if not calls[r].done():
                continue  # the answer of a call made before this one
            if calls[r].code() not in _NOT_REACHED:
                return r
            if deadline - time.monotonic() > _ASK_AGAIN_AFTER:
                time.sleep(_ASK_AGAIN_AFTER)
                calls[r] = ask(r)
    finally:
        for call in calls:
            call.cancel()


def _directory(rank: RankChannel, rpc_timeout: float) -> svc_pb2.ListSessionsResponse:
    """The group's directory as `rank` knows it (where every rank is served): the first page of
    its ListSessions."""
    response: svc_pb2.ListSessionsResponse = rank.service.ListSessions(
        svc_pb2.ListSessionsRequest(page_size=1), timeout=rpc_timeout)
    return response
