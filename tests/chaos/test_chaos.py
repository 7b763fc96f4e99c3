"""Chaos: a Python trainer runs a small model for STEPS steps on a 3-rank group under its
supervisor (deploy/local/ranks.sh: a killed rank is started again, the survivors exit for the
group to restart, rank 0 restores every session from its newest automatic checkpoint), while the
test SIGKILLs ranks at seeded moments: while a step runs, while an automatic checkpoint is being
written, between steps, and two ranks at once; rank 0 among them. The run finishes unattended
(the client waits for the group, redoes its step or rewinds its data) and its final parameters
and optimizer state are bit for bit those of an undisturbed run. The recovery time of each kill
(kill -> the next applied step) is printed. The kills begin once the session's first automatic
checkpoint is complete: a session lost before it has nothing to be restored from."""

from __future__ import annotations

import pathlib
import random
import threading
import time
from typing import Dict, List, Optional, Tuple

import pytest
import torch

import optstep
from optstep import config, pb
from optstep.torch import RemoteOptimizer
from resumable import assert_bit_identical, parameters_of, state_of, train_steps
from supervised_group import SupervisedGroup
from support import make_mlp

WORLD = 3
STEPS = 60
SEED = 15
# The moments, in the order they happen: (kind, ranks killed).
MOMENTS = ("mid-step", "mid-save", "idle", "two-at-once")


def _optimizer(kind: str) -> pb.OptimizerConfig:
    if kind == "muon":
        return config.muon_chain(lr=0.02)
    return config.soap_chain(lr=3e-3, precondition_frequency=2)


class Chaos:
    """Kills ranks of `group` at the planned steps, from the training loop's callbacks, and
    notes when each kill happened and when the next step was applied."""

    def __init__(self, group: SupervisedGroup, session_id: str, seed: int) -> None:
        rng = random.Random(seed)
        self.group = group
        self.session_id = session_id
        steps = sorted(rng.sample(range(5, STEPS - 5), len(MOMENTS)))
        # Each rank alone once (rank 0 included), then two of them.
        victims = [[r] for r in rng.sample(range(WORLD), WORLD)] + [rng.sample(range(WORLD), 2)]
        self.plan: Dict[int, Tuple[str, List[int]]] = {
            step: (kind, ranks) for step, kind, ranks in zip(steps, MOMENTS, victims)}
        self.killed_at: Optional[float] = None
        self.recoveries: List[Tuple[str, List[int], float]] = []
        self._timer: Optional[threading.Timer] = None
        self.in_step = False
        self.step_began = 0.0
        self.during_step: List[bool] = []  # whether each mid-step kill found the step running

    def before_step(self, step: int) -> None:
        self.step_began = time.monotonic()
        planned = self.plan.get(step)
        if planned and planned[0] == "mid-step" and self.killed_at is None:
            self._await_first_checkpoint()
            # The step is on the wire when this fires: it waits for the other trainer of
            # none, so it is killed within the step's few milliseconds or just after.
            self._timer = threading.Timer(0.002, self._kill, args=(step,))
            self._timer.start()

    def after_step(self, step: int) -> None:
        # A step that began before the kill may still end well: the next one counts.
        if self.killed_at is not None and self.step_began > self.killed_at:
            kind, ranks = self._current
            self.recoveries.append((kind, ranks, time.monotonic() - self.killed_at))
            self.killed_at = None
        planned = self.plan.get(step)
        if planned is None or planned[0] == "mid-step":
            return
        self._await_first_checkpoint()
        if planned[0] == "mid-save":
            self._await_save_in_progress(step)
        self._kill(step)

    def _kill(self, step: int) -> None:
        kind, ranks = self.plan.pop(step)
        if kind == "mid-step":
            self.during_step.append(self.in_step)
        self._current = (kind, ranks)
        self.killed_at = self.group.kill(*ranks)

    def _await_first_checkpoint(self) -> None:
        """A session lost before its first automatic checkpoint is complete cannot come back
        (rank 0 has nothing to restore it from): the kills wait for one."""
        saved = self.group.checkpoint_root / "auto" / self.session_id
        deadline = time.monotonic() + 20.0
        while not list(saved.glob("step-*/manifest.json")):
            assert time.monotonic() < deadline, "no automatic checkpoint within 20 s"
            time.sleep(0.01)

    def _await_save_in_progress(self, step: int) -> None:
        """Returns once the automatic checkpoint of `step` has begun and not ended (or after a
        second: the moment is then as close to a save as could be seen)."""
        saved = self.group.checkpoint_root / "auto" / self.session_id
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            entries = list(saved.glob(f"*step-{step}*")) if saved.exists() else []
            if entries and not self.group.checkpoint_done(self.session_id, step):
                return
            time.sleep(0.001)


def _train(model: torch.nn.Module, opt: RemoteOptimizer, chaos: Optional[Chaos]) -> List[int]:
    if chaos is None:
        return train_steps(model, opt, STEPS)
    original = opt.step

    def step_with_chaos(closure: object = None) -> object:
        chaos.before_step(opt.next_step)
        chaos.in_step = True
        try:
            return original()
        finally:
            chaos.in_step = False

    opt.step = step_with_chaos  # type: ignore[method-assign]
    return train_steps(model, opt, STEPS, after_step=chaos.after_step)


@pytest.mark.parametrize("kind", ["muon", "soap"])
def test_killed_ranks_heal_and_the_run_ends_bit_for_bit(server_binary: str, kind: str,
                                                        tmp_path: pathlib.Path) -> None:
    with optstep.LocalGroup(WORLD, server_binary) as ranks, \
            optstep.Client(rank_targets=ranks.targets) as client:
        model = make_mlp(SEED)
        opt = RemoteOptimizer(model, client, optimizer=_optimizer(kind))
        _train(model, opt, None)
        expected_params, expected_state = parameters_of(model), state_of(opt)

    began = time.monotonic()
    with SupervisedGroup(server_binary, WORLD, tmp_path) as group, \
            optstep.Client(rank_targets=group.targets, recovery_timeout=60) as client:
        model = make_mlp(SEED)
        opt = RemoteOptimizer(model, client, optimizer=_optimizer(kind))
        chaos = Chaos(group, opt.session_id, SEED)
        planned = dict(chaos.plan)
        rewinds = _train(model, opt, chaos)
        report = ", ".join(f"{k} {r}: {s:.2f} s" for k, r, s in chaos.recoveries)
        print(f"\nchaos {kind}: plan {planned}; kill -> next applied step: {report}; "
              f"mid-step kill during the step: {chaos.during_step}; rewound to {rewinds}; "
              f"{time.monotonic() - began:.1f} s in all")
        assert not chaos.plan, f"kills not done: {chaos.plan}"
        assert len(chaos.recoveries) == len(MOMENTS), report
        assert opt.next_step == STEPS + 1
        assert_bit_identical(parameters_of(model), expected_params, "parameters")
        assert_bit_identical(state_of(opt), expected_state, "optimizer state")
