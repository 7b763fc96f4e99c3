"""optstep.recovery.StepRecovery against a scripted group: a step's parameters come back as each
rank stepped its own, before the ranks' all-gather ends the step, so a trainer may send the next
step while the session still reads the step before. That step is sent again in its turn (an
out-of-sequence answer) or redone after a recovery, never rewound; a session that stays below the
step seen applied (restored to an older one) is still a rewind, but not a session that the group
is restoring while rank 0 does not serve (made again at step 0, its checkpoint not yet loaded).
A step that still fails once rank 0 serves again is tried until the recovery timeout, and no
longer."""

from __future__ import annotations

import time
from typing import Callable, List, Optional

import pytest

from optstep.errors import (EXPECTED_STEP_PAYLOAD, DeadlineExceededError, FailedPreconditionError,
                            NotFoundError, UnavailableError)
from optstep.recovery import RewindRequired, StepRecovery
from optstep.v1 import session_pb2


class EndingGroup:
    """Rank 0 serves; the session's step is read from `steps` in turn (the last repeated, and
    running a step before it)."""

    def __init__(self, steps: List[int]) -> None:
        self.steps = steps
        self.reads = 0

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        return True

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        read = min(self.reads, len(self.steps) - 1)
        self.reads += 1
        return session_pb2.SessionInfo(session_id=session_id, step=self.steps[read],
                                       step_running=read + 1 < len(self.steps))


def attempts(failures: List[Exception], reply: int) -> Callable[[], int]:
    """Raises `failures` in turn, then answers `reply`."""
    calls = iter(failures)

    def attempt() -> int:
        failure = next(calls, None)
        if failure is not None:
            raise failure
        return reply

    return attempt


def restored(timeout: float) -> int:
    return 99


def recovery() -> StepRecovery:
    return StepRecovery(10.0, sleep=lambda seconds: None)


def test_a_step_sent_while_the_last_one_still_ends_is_sent_again_in_its_turn() -> None:
    steps = recovery()
    assert steps.run(EndingGroup([3]), "s", 3, attempts([], 3), restored) == 3
    group = EndingGroup([2, 2, 2, 3])
    out_of_turn = FailedPreconditionError("step 4 out of sequence; expected step 3")
    assert steps.run(group, "s", 4, attempts([out_of_turn], 4), restored) == 4
    assert group.reads == 4
    # A recovery that finds the session still ending the last step waits for it, then redoes.
    group = EndingGroup([3, 3, 4])
    assert steps.run(group, "s", 5, attempts([UnavailableError("reset")], 5), restored) == 5
    assert group.reads == 3


def test_a_session_past_the_step_sent_is_an_error_not_the_step_applied() -> None:
    """A session past the step sent, once the group serves again, runs another timeline (a
    restart restored checkpoints that a Load had left): every step needs this trainer, so none
    past its own was applied for it. Before, the other timeline's parameters were answered as
    the step's."""
    steps = recovery()
    out_of_turn = FailedPreconditionError("step 305 out of sequence; expected step 501")
    with pytest.raises(FailedPreconditionError, match="at step 500, past step 305"):
        steps.run(EndingGroup([500]), "s", 305, attempts([UnavailableError("reset"), out_of_turn],
                                                         305), restored)


def test_a_session_below_the_step_seen_applied_running_none_is_a_rewind_at_once() -> None:
    steps = recovery()
    assert steps.run(EndingGroup([3]), "s", 3, attempts([], 3), restored) == 3
    out_of_turn = FailedPreconditionError("step 4 out of sequence; expected step 2")
    group = EndingGroup([1])
    with pytest.raises(RewindRequired) as rewind:
        steps.run(group, "s", 4, attempts([out_of_turn], 4), restored)
    assert rewind.value.step == 1
    assert group.reads == 1  # restored: no step runs, nothing to wait for


def test_each_trainer_sharing_the_client_is_told_of_the_rewind() -> None:
    """Two trainers of one session share the client (threads): the first one's rewind does not
    make the second's step look like its own mistake (FAILED_PRECONDITION for ever after)."""
    steps = recovery()
    for trainer in (0, 1):
        assert steps.run(EndingGroup([4]), "s", 4, attempts([], 4), restored,
                         trainer_id=trainer) == 4
    for trainer in (0, 1):
        out_of_turn = FailedPreconditionError("step 5 out of sequence; expected step 3")
        with pytest.raises(RewindRequired) as rewind:
            steps.run(EndingGroup([2]), "s", 5, attempts([out_of_turn], 5), restored,
                      trainer_id=trainer)
        assert rewind.value.step == 2, f"trainer {trainer}"


def test_a_restart_for_one_trainer_leaves_the_others_to_be_told_of_the_rewind() -> None:
    """One trainer learned of the restore itself (a pull after its step broke) and restarts its
    own record only: the other trainer sharing the client is still told of the rewind. Before,
    the restart reset every trainer's record, and the other's next step failed out of sequence
    as its own mistake."""
    steps = recovery()
    told: List[tuple] = []
    steps.on_restart = lambda *args: told.append(args)
    for trainer in (0, 1):
        assert steps.run(EndingGroup([4]), "s", 4, attempts([], 4), restored,
                         trainer_id=trainer) == 4
    steps.restart("s", 2, trainer_id=0)
    assert told == [("s", 2, 0)]
    out_of_turn = FailedPreconditionError("step 5 out of sequence; expected step 3")
    with pytest.raises(RewindRequired) as rewind:
        steps.run(EndingGroup([2]), "s", 5, attempts([out_of_turn], 5), restored, trainer_id=1)
    assert rewind.value.step == 2
    # Trainer 0 goes on from step 3, as a trainer rewound does.
    assert steps.run(EndingGroup([2]), "s", 3, attempts([], 3), restored, trainer_id=0) == 3


def test_a_step_applied_whose_answer_was_lost_is_answered_when_redone() -> None:
    """The group applied step 5 while it recovered: the pull of its parameters is tried again
    while it fails for a recovering reason (before, the first failure was raised, and the trainer
    was told a step the server applied had failed); a caller that redoes step 5 gets its
    parameters, not FailedPreconditionError for ever. Step 5 sent again with other gradients
    (refused naming no expected step) stays the caller's error."""
    steps = recovery()
    pulls: List[int] = []

    def applied(timeout: float) -> int:
        pulls.append(1)
        if len(pulls) == 1:
            raise UnavailableError("pull: rank 1 is away")
        return 99

    def not_replayable() -> FailedPreconditionError:
        return FailedPreconditionError("step 5 out of sequence; expected step 6",
                                       payloads={EXPECTED_STEP_PAYLOAD: b"6"})

    assert steps.run(EndingGroup([5]), "s", 5,
                     attempts([UnavailableError("reset"), not_replayable()], 5), applied) == 99
    assert len(pulls) == 2
    assert steps.run(EndingGroup([5]), "s", 5, attempts([not_replayable()], 5), applied) == 99
    other = FailedPreconditionError("step 5 of session 's' was already applied with a different "
                                    "contribution from trainer 0")
    with pytest.raises(FailedPreconditionError, match="different contribution"):
        steps.run(EndingGroup([5]), "s", 5, attempts([other], 5), applied)


def test_the_pull_of_a_step_applied_ends_within_the_recovery_timeout() -> None:
    """The pull of a step the group applied while it recovered gets what is left of the recovery
    (60 s here; at least 30 s, since the step stands), not the stream timeout: before, a pull
    that hung (packets lost without a reset) held the trainer long past the recovery_timeout it
    set."""
    steps = StepRecovery(60.0, sleep=lambda seconds: None)
    timeouts: List[float] = []

    def applied(timeout: float) -> int:
        timeouts.append(timeout)
        if len(timeouts) == 1:
            raise UnavailableError("pull: rank 1 is away")
        return 99

    not_replayable = FailedPreconditionError("step 5 out of sequence; expected step 6",
                                             payloads={EXPECTED_STEP_PAYLOAD: b"6"})
    assert steps.run(EndingGroup([5]), "s", 5,
                     attempts([UnavailableError("reset"), not_replayable], 5), applied) == 99
    assert len(timeouts) == 2 and all(30.0 <= t <= 60.0 for t in timeouts), timeouts


def test_a_pull_of_a_step_applied_that_answers_an_earlier_step_is_a_rewind() -> None:
    """The pull tried again meanwhile answers the parameters of an earlier step (the group
    restarted and restored an older checkpoint while it was tried): a rewind to that step, not
    step 5's answer. Before, the pull's values were answered as step 5's."""
    steps = recovery()
    pulls: List[int] = []

    def applied(timeout: float) -> int:
        pulls.append(1)
        if len(pulls) == 1:
            raise UnavailableError("pull: rank 0 is away")
        return 4  # the step of the values pulled

    def not_replayable() -> FailedPreconditionError:
        return FailedPreconditionError("step 5 out of sequence; expected step 6",
                                       payloads={EXPECTED_STEP_PAYLOAD: b"6"})

    with pytest.raises(RewindRequired) as rewind:
        steps.run(EndingGroup([5]), "s", 5,
                  attempts([UnavailableError("reset"), not_replayable()], 5), applied,
                  step_of=lambda reply: reply)
    assert rewind.value.step == 4


def test_an_expected_next_step_is_no_answer_for_a_step_not_seen_applied() -> None:
    not_replayable = FailedPreconditionError("step 5 out of sequence; expected step 6",
                                             payloads={EXPECTED_STEP_PAYLOAD: b"6"})
    with pytest.raises(FailedPreconditionError, match="expected step 6"):
        recovery().run(EndingGroup([5]), "s", 5, attempts([not_replayable], 5), restored)


class AwayWhileEnding:
    """Rank 0 serves; the session reads as ending step 4 once, then its reads fail."""

    def __init__(self) -> None:
        self.reads = 0

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        return True

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        self.reads += 1
        if self.reads == 1:
            return session_pb2.SessionInfo(session_id=session_id, step=4, step_running=True)
        time.sleep(0.02)
        raise UnavailableError("rank 0 is away again")


def test_reads_that_fail_while_a_step_ends_are_no_rewind() -> None:
    """The last step read while the session still ends the step before one seen applied is not
    taken for a restore when later reads fail: the recovery ends with an error, not a rewind."""
    steps = StepRecovery(0.2, sleep=lambda seconds: None)
    steps.note("s", 5)
    with pytest.raises(UnavailableError) as raised:
        steps.run(AwayWhileEnding(), "s", 6, attempts([UnavailableError("reset")], 6), restored)
    assert not isinstance(raised.value, RewindRequired)


def test_a_step_that_fails_while_the_group_serves_ends_with_the_timeout() -> None:
    # Rank 0 serves, but the step cannot be taken (a rank it cannot reach).
    steps = StepRecovery(0.2)
    failures: List[Exception] = [UnavailableError("rank 1 is away") for _ in range(10000)]
    attempt = attempts(failures, 1)
    started = time.monotonic()
    with pytest.raises(UnavailableError) as error:
        steps.run(EndingGroup([0]), "s", 1, attempt, restored)
    assert error.value.message == (
        "rank 1 is away (the group serves session 's' again, but the step still failed when "
        "recovery_timeout 0.2 s ran out)")
    assert time.monotonic() - started < 5.0


class RestoringGroup:
    """Rank 0 serves from its third look on; until then the session is at step 0 (made again,
    its checkpoint not yet loaded), then at `restored`."""

    def __init__(self, restored: int) -> None:
        self.restored = restored
        self.looks = 0

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        self.looks += 1
        return self.looks > 2

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        return session_pb2.SessionInfo(session_id=session_id,
                                       step=self.restored if self.looks > 2 else 0)


def test_a_step_that_meets_a_session_being_restored_waits_for_the_group() -> None:
    steps = recovery()
    assert steps.run(EndingGroup([3]), "s", 3, attempts([], 3), restored) == 3
    out_of_turn = FailedPreconditionError("step 4 out of sequence; expected step 1")
    assert steps.run(RestoringGroup(3), "s", 4, attempts([out_of_turn], 4), restored) == 4


class ClosedGroup:
    """The client was closed: every look at the group raises as a closed client does."""

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        raise FailedPreconditionError("Client: closed")

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        raise FailedPreconditionError("Client: closed")


def test_a_client_closed_during_a_recovery_ends_the_wait_at_once() -> None:
    steps = StepRecovery(10.0)
    started = time.monotonic()
    with pytest.raises(FailedPreconditionError, match="Client: closed"):
        steps.run(ClosedGroup(), "s", 1, attempts([UnavailableError("reset")], 1), restored)
    assert time.monotonic() - started < 5.0


def test_a_callers_own_out_of_sequence_step_while_rank_0_does_not_serve_is_its_error() -> None:
    # The session is at step 0 once rank 0 serves, and this client saw no step applied.
    out_of_turn = FailedPreconditionError("step 5 out of sequence; expected step 1")
    with pytest.raises(FailedPreconditionError, match="step 5 out of sequence"):
        recovery().run(RestoringGroup(0), "s", 5, attempts([out_of_turn], 5), restored)


class SilentGroup:
    """Hosts that drop packets: every call waits its whole timeout, and records it."""

    def __init__(self) -> None:
        self.timeouts: List[float] = []

    def _silent(self, timeout: Optional[float]) -> None:
        assert timeout is not None, "a probe without a timeout waits its whole rpc_timeout"
        self.timeouts.append(timeout)
        time.sleep(min(timeout, 5.0))
        raise DeadlineExceededError("no answer")

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        self._silent(timeout)
        return False

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        self._silent(timeout)
        return session_pb2.SessionInfo()


def test_probes_end_by_the_recovery_deadline() -> None:
    """Each probe is told the time left, so that the step ends within recovery_timeout rather
    than minutes later."""
    group = SilentGroup()
    start = time.monotonic()
    with pytest.raises(UnavailableError, match="within recovery_timeout 0.3 s"):
        StepRecovery(0.3, sleep=lambda seconds: None).run(
            group, "s", 1, attempts([UnavailableError("reset")], 1), restored)
    assert time.monotonic() - start < 3.0
    assert group.timeouts and max(group.timeouts) <= 0.3


class JustStarted:
    """Rank 0's new process answers SERVING once before it knows the session, then not, then
    serves it at step 4."""

    def __init__(self) -> None:
        self.looks = 0
        self.reads = 0

    def check_health(self, service: str = "", *, timeout: Optional[float] = None) -> bool:
        self.looks += 1
        return self.looks != 2

    def get_session(self, session_id: str, *,
                    timeout: Optional[float] = None) -> session_pb2.SessionInfo:
        self.reads += 1
        if self.reads == 1:
            raise NotFoundError(f"session '{session_id}' not found")
        return session_pb2.SessionInfo(session_id=session_id, step=4)


def test_a_session_unknown_to_a_rank_just_started_is_waited_for() -> None:
    """A session that a rank 0 just started does not know yet is no session gone: it does not
    serve once asked again, and the step is redone once it serves."""
    assert recovery().run(JustStarted(), "s", 5,
                          attempts([UnavailableError("Socket closed")], 5), restored) == 5


def test_a_session_whose_state_was_replaced_is_no_rewind_of_what_was_seen_before() -> None:
    """A trainer saw step 5 applied; the session's state was then replaced at step 2 (a Load of
    an earlier checkpoint, an import): a step refused out of sequence is the caller's, not a
    rewind of the group. Before, the mark of step 5 stayed, and such a refusal raised
    RewindRequired (the loop rewound again)."""
    steps = recovery()
    steps.note("s", 5)
    out_of_turn = FailedPreconditionError("step 4 out of sequence; expected step 3")
    with pytest.raises(RewindRequired):
        steps.run(EndingGroup([2]), "s", 4, attempts([out_of_turn], 4), restored)
    steps.note("s", 5)
    steps.restart("s", 2)
    with pytest.raises(FailedPreconditionError, match="expected step 3") as refused:
        steps.run(EndingGroup([2]), "s", 4, attempts([out_of_turn], 4), restored)
    assert not isinstance(refused.value, RewindRequired)
    assert steps.run(EndingGroup([2]), "s", 3, attempts([], 3), restored) == 3
