"""Steps that survive a recovering server group (docs/python.md, "When the group recovers").

A group that loses a rank restarts as a whole and restores every session from its newest
automatic checkpoint, with the same session ids (docs/deploy.md, "Failure handling"). A trainer's
step that fails meanwhile (UNAVAILABLE, a broken stream, a rank that is not serving) is not lost:
:class:`StepRecovery` keeps the step's gradients, waits for the group with exponential backoff
for at most ``recovery_timeout`` seconds, reads the session again (GetSession by id) and then

- redoes the step with the same bytes when the session is at the step before it (also once the
  last step ended, when the step was sent before the ranks had ended the last one: its
  parameters come back before that);
- answers the step's result when the session has applied it (the server's replay, else the
  restored parameters);
- raises :class:`RewindRequired` when the session was rolled back further: older steps need the
  training loop's data, so only the loop can redo them.

Internal to the client, apart from :class:`RewindRequired`. Thread-safe: it keeps no state
between calls apart from the last step each session was seen to apply.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Optional, Protocol, Tuple, TypeVar

import grpc

from optstep.errors import (EXPECTED_STEP_PAYLOAD, AbortedError, FailedPreconditionError,
                            InvalidArgumentError, NotFoundError, OptstepError, UnavailableError,
                            error_for)
from optstep.v1 import session_pb2

__all__ = ["RewindRequired", "StepRecovery"]

# What one attempt of a step answers.
_Reply = TypeVar("_Reply")

# Codes that mean "the group may be recovering" when rank 0 is not serving at the same time.
# UNAVAILABLE always means it.
_WHEN_NOT_SERVING = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                     grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED,
                     grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
# Backoff between looks at the group: the first wait and the longest one, in seconds.
_FIRST_WAIT = 0.05
_LONGEST_WAIT = 1.0
# The least time (seconds) the pull of a step the session applied gets, whatever is left of the
# recovery.
_LEAST_APPLIED_PULL = 30.0
# How long a session may take to reach the step this client saw applied (from a server of an
# earlier release a step's parameters could come back before the ranks' all-gather ended it; a
# rank's stream now ends only once the step ended on it), and the polls.
_STEP_END_WAIT = 30.0
_FIRST_STEP_END_POLL = 0.005
_LONGEST_STEP_END_POLL = 0.1


class RewindRequired(AbortedError):
    """The group restored the session to an older step than the one this trainer was at.

    ``step`` is the session's restored step: steps 1..``step`` are applied, and the next one to
    compute is ``next_step`` (= ``step + 1``). The training loop rewinds its data to that step
    and goes on; the gradients of the later steps were never applied::

        try:
            opt.step()
        except optstep.RewindRequired as rewind:
            data.seek(rewind.step)   # the batch of step rewind.step + 1 comes next
    """

    def __init__(self, session_id: str, step: int, failed_step: int) -> None:
        super().__init__(
            f"session '{session_id}' was restored to step {step} while step {failed_step} ran; "
            f"rewind the training data to step {step + 1} and go on from there")
        self.session_id = session_id
        self.step = step
        self.failed_step = failed_step

    @property
    def next_step(self) -> int:
        """The step the training loop computes next."""
        return self.step + 1


class GroupView(Protocol):
    """What recovery asks of the client: rank 0's health and a session's current info, each
    within `timeout` seconds (its calls cut there), so that a recovery ends within its own
    timeout also where hosts drop packets and every call would wait its whole rpc_timeout."""

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool: ...

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo: ...


class StepRecovery:
    """Runs a step's attempts until one is answered, waiting out a recovering group.

    Args:
      timeout: seconds to wait for the group after a failure; 0 raises every error at once.
      clock, sleep: the monotonic clock and the sleep (tests pass others).
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if timeout < 0:
            raise InvalidArgumentError(f"Client: recovery_timeout {timeout} must be >= 0")
        self.timeout = timeout
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        # The last step each trainer of each session was seen to apply: trainers that share the
        # client (threads) each keep theirs, so that one's rewind does not hide it from another.
        self._applied: Dict[Tuple[str, int], int] = {}
        # Told (session id, step) when a session's state was replaced (restart): the native
        # client keeps marks of its own.
        self.on_restart: Optional[Callable[[str, int, Optional[int]], None]] = None

    def run(self, group: GroupView, session_id: str, step: int, attempt: Callable[[], _Reply],
            applied: Callable[[float], _Reply], *, trainer_id: int = 0,
            step_of: Optional[Callable[[_Reply], int]] = None) -> _Reply:
        """`attempt()` sends step `step` of trainer `trainer_id` (the same bytes each time) and
        answers its reply; `applied(timeout)` answers, within `timeout` seconds (what is left of
        the recovery, and at least 30), the reply of a step the session has applied but can no
        longer replay, and `step_of` (when given) the step of its values."""
        if self.timeout <= 0:
            return attempt()
        key = (session_id, trainer_id)
        deadline: Optional[float] = None
        wait = _FIRST_WAIT
        was_applied = False
        retried_in_turn = False

        def probes_by() -> float:
            """Every probe ends by the recovery's deadline, or before one began, by when it
            would."""
            return deadline if deadline is not None else self._clock() + self.timeout

        while True:
            try:
                reply = attempt()
                self.note(session_id, step, trainer_id=trainer_id)
                return reply
            except OptstepError as error:
                # Out of sequence while rank 0 does not serve: a session that the group is
                # restoring (made again, its checkpoint not yet loaded) is waited for below.
                if isinstance(error, FailedPreconditionError) and \
                        not self._not_serving(group, probes_by()):
                    # Out of sequence: the last step is still ending on the ranks, the
                    # session's step moved back, or the applied step is not replayable after a
                    # restore, or a mistake of the caller.
                    info = self._session_now(group, session_id, error, probes_by())
                    ending = info.step_running and info.step < self._applied_step(key)
                    info = self._await_seen_step(group, key, info, error, probes_by())
                    if info.step < self._applied_step(key):
                        raise self._rewind(key, info.step, step) from None
                    # Applied while the group recovered; or applied and seen so before, and
                    # redone because its answer was lost (the pull of its parameters failed):
                    # the session, restored since, is at it and expects the next one. (A
                    # refusal of other gradients names no step.)
                    answer_lost = self._applied_step(key) >= step and info.step == step and \
                        error.payload_number(EXPECTED_STEP_PAYLOAD) == step + 1
                    if (was_applied and info.step == step) or answer_lost:
                        self.note(session_id, step, trainer_id=trainer_id)
                        return self._applied_by(group, key, step, applied, step_of,
                                                probes_by())
                    # The last step ended meanwhile: this one's turn (once).
                    if ending and info.step + 1 == step and not retried_in_turn:
                        retried_in_turn = True
                        continue
                    raise
                # The recovery's time counts from its first error, the probe that tells it one
                # included.
                by = probes_by()
                if not self._recovering(group, error, by):
                    raise
                if deadline is None:
                    deadline = by
                elif self._clock() >= deadline:
                    # Rank 0 serves the session again, yet the step still fails (a rank it
                    # cannot reach).
                    raise error_for(error.code, f"{error.message} (the group serves session "
                                    f"'{session_id}' again, but the step still failed when "
                                    f"recovery_timeout {self.timeout:g} s ran out)") from None
                info = self._await_group(group, session_id, deadline, wait, error)
                info = self._await_seen_step(group, key, info, error, deadline)
                wait = min(2 * wait, _LONGEST_WAIT)
                if info.step > step:
                    # Every step needs this trainer's gradients: a session past the one it
                    # sends runs another timeline (a restart restored checkpoints that a Load or
                    # an import had left), and none of its steps is this trainer's.
                    raise FailedPreconditionError(
                        f"session '{session_id}' is at step {info.step}, past step {step} that "
                        f"trainer {trainer_id} sends: none of its steps is this trainer's (its "
                        "state was likely replaced by another timeline while the group "
                        "recovered, or another process sends as this trainer); load the state to "
                        "go on from, and rewind to it") from None
                if info.step < step - 1:
                    # Out of sequence while rank 0 did not serve, and the session is not behind
                    # a step this client saw applied: the caller's own mistake, not a restore.
                    if isinstance(error, FailedPreconditionError) and \
                            info.step >= self._applied_step(key):
                        raise
                    raise self._rewind(key, info.step, step) from None
                was_applied = info.step == step

    def _await_seen_step(self, group: GroupView, key: Tuple[str, int],
                         info: session_pb2.SessionInfo, error: OptstepError,
                         by: float) -> session_pb2.SessionInfo:
        """`info`, or while its step is below the last step this client saw applied and a step
        runs (that step's parameters come back before the ranks ended it), the session once
        that ended, polling for at most _STEP_END_WAIT seconds. A session restored to an older
        step runs none. Raises `error` when a read fails, and past `by` (never answers a stale
        step, which would read as a restore)."""
        session_id, seen = key[0], self._applied_step(key)
        poll, waited = _FIRST_STEP_END_POLL, 0.0
        while info.step_running and info.step < seen and waited < _STEP_END_WAIT:
            if self._clock() >= by:
                raise error_for(error.code, f"{error.message} (session '{session_id}' was still "
                                f"ending the step before step {seen} when recovery_timeout "
                                f"{self.timeout:g} s ran out)") from None
            self._sleep(poll)
            waited += poll
            poll = min(2 * poll, _LONGEST_STEP_END_POLL)
            info = self._session_now(group, session_id, error, by)
        return info

    def run_while_unavailable(self, attempt: Callable[[], _Reply]) -> _Reply:
        """Runs `attempt`, a call that may be made again as it is (initial values before step
        1), until it raises anything but UnavailableError (a group that heals refuses it
        meanwhile, having done nothing), backing off as `run` does, within the timeout: its
        last error past it."""
        deadline = self._clock() + self.timeout
        wait = _FIRST_WAIT
        while True:
            try:
                return attempt()
            except UnavailableError:
                if self._clock() + wait > deadline:
                    raise
            self._sleep(wait)
            wait = min(2 * wait, _LONGEST_WAIT)

    def note(self, session_id: str, step: int, *, trainer_id: int = 0) -> None:
        """Step `step` of the session was applied for trainer `trainer_id` (by a step that did
        not go through run)."""
        key = (session_id, trainer_id)
        with self._lock:
            self._applied[key] = max(step, self._applied.get(key, 0))

    def restart(self, session_id: str, step: int, trainer_id: Optional[int] = None) -> None:
        """The session's state was replaced (a Load, an import) at `step`: what its trainers saw
        applied before no longer holds. Past it, a step refused out of sequence would be taken
        for a rewind of the group, and a redo for a step applied. With `trainer_id`, for that
        trainer alone (it learned of a restore by itself; the others are told as a rewind)."""
        with self._lock:
            keys = ([(session_id, trainer_id)] if trainer_id is not None
                    else [k for k in self._applied if k[0] == session_id])
            for key in keys:
                self._applied[key] = step
        if self.on_restart is not None:
            self.on_restart(session_id, step, trainer_id)

    def _applied_step(self, key: Tuple[str, int]) -> int:
        with self._lock:
            return self._applied.get(key, 0)

    def _rewind(self, key: Tuple[str, int], restored: int, step: int) -> RewindRequired:
        with self._lock:
            self._applied[key] = restored
        return RewindRequired(key[0], restored, step)

    def _left(self, by: float) -> float:
        """Seconds until `by`, on the recovery's clock."""
        return max(0.0, by - self._clock())

    def _session_now(self, group: GroupView, session_id: str, error: OptstepError,
                     by: float) -> session_pb2.SessionInfo:
        try:
            return group.get_session(session_id, timeout=self._left(by))
        except OptstepError:
            raise error from None

    def _serving(self, group: GroupView, by: float) -> bool:
        try:
            return group.check_health(timeout=self._left(by))
        except FailedPreconditionError:
            raise  # the client was closed: nothing to wait for
        except OptstepError:
            return False

    def _applied_by(self, group: GroupView, key: Tuple[str, int], step: int,
                    applied: Callable[[float], _Reply], step_of: Optional[Callable[[_Reply], int]],
                    by: float) -> _Reply:
        """`applied(timeout)` (the parameters of `step`, which the session applied, within what is
        left until `by`: a pull that hung held the trainer for the stream timeout), tried again
        while it fails for a recovering reason (a rank still healing in, one lost during the
        pull) until `by`: the step stands, and the trainer must not be told it failed.
        Parameters of an earlier step (the group restored meanwhile) are a rewind to it."""
        wait = _FIRST_WAIT
        while True:
            try:
                # At least _LEAST_APPLIED_PULL: the step stands, and the recovery's last moments
                # must not make it an error.
                reply = applied(max(self._left(by), _LEAST_APPLIED_PULL))
            except OptstepError as error:
                if self._clock() >= by or not self._recovering(group, error, by):
                    raise error_for(error.code, f"step {step} of session '{key[0]}' was applied, "
                                    f"but its parameters were not pulled: {error.message}") \
                        from error
            else:
                if step_of is not None and step_of(reply) < step:
                    raise self._rewind(key, step_of(reply), step)
                return reply
            self._sleep(min(wait, max(0.0, by - self._clock())))
            wait = min(2 * wait, _LONGEST_WAIT)

    def _recovering(self, group: GroupView, error: OptstepError, by: float) -> bool:
        if error.code == grpc.StatusCode.UNAVAILABLE:
            return True
        if error.code not in _WHEN_NOT_SERVING:
            return False
        return self._not_serving(group, by)

    def _not_serving(self, group: GroupView, by: float) -> bool:
        """Whether rank 0 does not serve now: it answers so, or does not answer by `by`."""
        try:
            return not group.check_health(timeout=self._left(by))
        except FailedPreconditionError:
            raise  # the client was closed: nothing to wait for
        except OptstepError as health:  # unreachable: recovering; no health service: not
            return health.code in (grpc.StatusCode.UNAVAILABLE,
                                   grpc.StatusCode.DEADLINE_EXCEEDED)

    def _await_group(self, group: GroupView, session_id: str, deadline: float, wait: float,
                     error: OptstepError) -> session_pb2.SessionInfo:
        """Waits (backing off from `wait`) until rank 0 serves, then answers the session.
        Past `deadline`, raises `error` with how long the group was waited for."""
        while True:
            self._sleep(min(wait, max(0.0, deadline - self._clock())))
            if self._serving(group, deadline):
                try:
                    return group.get_session(session_id, timeout=self._left(deadline))
                except NotFoundError:
                    # Serving without the session (closed, or not restored): the step's error.
                    # Unless rank 0 no longer serves once asked again: a process that has just
                    # started answers SERVING for a moment, before it knows its sessions.
                    if self._serving(group, deadline):
                        raise error from None
                except OptstepError:
                    pass  # lost again: wait on
            if self._clock() >= deadline:
                raise error_for(error.code, f"{error.message} (the group did not serve session "
                                f"'{session_id}' again within recovery_timeout "
                                f"{self.timeout:g} s)") from None
            wait = min(2 * wait, _LONGEST_WAIT)
