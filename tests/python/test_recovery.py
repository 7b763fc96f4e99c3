"""Trainers resume by themselves: a group under its supervisor (deploy/local/ranks.sh) with
automatic checkpoints is SIGKILLed while a step waits for its second trainer; the step
completes by itself (redone with the same bytes once the group has restored the session) and the
run ends bit for bit where an undisturbed one ends. A group that comes back at an older step
makes RemoteOptimizer pull the restored parameters, call on_rewind and raise RewindRequired with
the restored step; the loop rewinds its data and ends bit for bit too. A trainer's first step
waits for the group as well. With recovery_timeout 0 a step fails at once, as before."""

from __future__ import annotations

import pathlib
import threading
import uuid
from typing import Dict, Iterator, List

import numpy as np
import pytest
import torch
from torch import nn

import optstep
from optstep import config, pb
from optstep.torch import RemoteOptimizer
from resumable import assert_bit_identical, batch, parameters_of, state_of, train_steps
from supervised_group import SupervisedGroup
from support import loss_of, make_mlp

SHAPES = {"w": (8, 6), "b": (6,)}
TRAINERS = 2


def _spec() -> pb.SessionSpec:
    return pb.SessionSpec(name=f"recovery-{uuid.uuid4().hex[:8]}", num_trainers=TRAINERS,
                          gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name=n, shape=list(s))
                                      for n, s in SHAPES.items()],
                          optimizer=config.muon_chain(lr=0.02))


def _gradients(step: int, trainer: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * step + trainer)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _step_all(clients: List[optstep.Client], session: str, step: int) -> None:
    """Every trainer's step `step`, concurrently (each waits for the others)."""
    errors: List[BaseException] = []

    def run(t: int) -> None:
        try:
            clients[t].step(session, step, _gradients(step, t), trainer_id=t)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _create(client: optstep.Client) -> str:
    info, _ = client.create_session(_spec())
    rng = np.random.default_rng(7)
    client.init_parameters(info.session_id, {n: rng.standard_normal(s).astype(np.float32)
                                             for n, s in SHAPES.items()})
    return info.session_id


@pytest.fixture
def group(server_binary: str, tmp_path: pathlib.Path) -> Iterator[SupervisedGroup]:
    with SupervisedGroup(server_binary, 2, tmp_path) as supervised:
        yield supervised


def _reference_params(server_binary: str, steps: int) -> Dict[int, np.ndarray]:
    with optstep.LocalGroup(2, server_binary) as ranks:
        clients = [optstep.Client(rank_targets=ranks.targets) for _ in range(TRAINERS)]
        session = _create(clients[0])
        for step in range(1, steps + 1):
            _step_all(clients, session, step)
        params = clients[0].pull_parameters(session).params
        for client in clients:
            client.close()
        return params


def _trainers(group: SupervisedGroup) -> List[optstep.Client]:
    return [optstep.Client(rank_targets=group.targets, recovery_timeout=60)
            for _ in range(TRAINERS)]


def _checkpointed_at_step_3(group: SupervisedGroup, clients: List[optstep.Client]) -> str:
    """A session made by `clients`, stepped 3 times and saved by its automatic checkpoints."""
    session = _create(clients[0])
    for step in (1, 2, 3):
        _step_all(clients, session, step)
    group.await_checkpoint(session, 3)
    return session


def test_a_step_during_which_the_group_is_killed_completes_by_itself(
        server_binary: str, group: SupervisedGroup) -> None:
    clients = _trainers(group)
    session = _checkpointed_at_step_3(group, clients)
    # Trainer 0's step 4 waits for trainer 1 when the whole group is killed.
    replies: List[optstep.StepReply] = []
    waiting = threading.Thread(target=lambda: replies.append(
        clients[0].step(session, 4, _gradients(4, 0), trainer_id=0)))
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive(), "step 4 did not wait for trainer 1"
    group.kill(0, 1)
    # Trainer 1 meets a group that is down or restoring, and waits for it too.
    reply = clients[1].step(session, 4, _gradients(4, 1), trainer_id=1)
    waiting.join(timeout=60)
    assert not waiting.is_alive() and replies and replies[0].step == 4 and reply.step == 4
    assert "event=session_restored" in group.log(0)
    _step_all(clients, session, 5)
    params = clients[0].pull_parameters(session).params
    expected = _reference_params(server_binary, 5)
    assert params.keys() == expected.keys()
    for pid in expected:
        assert params[pid].tobytes() == expected[pid].tobytes(), f"param {pid} differs"
    for client in clients:
        client.close()


def test_a_trainers_first_step_waits_for_a_group_that_is_away(
        server_binary: str, group: SupervisedGroup) -> None:
    """Trainers that know the session but have not stepped yet (no shared memory attached, no
    connection of the native library) meet a killed group at their first step: it waits for
    the group, as a later step does, and is applied once."""
    first = _trainers(group)
    session = _checkpointed_at_step_3(group, first)
    fresh = _trainers(group)
    for client in fresh:
        client.layout(session)  # known before the group is lost, as after attaching to it
    group.kill(0, 1)
    _step_all(fresh, session, 4)
    params = fresh[0].pull_parameters(session).params
    expected = _reference_params(server_binary, 4)
    for pid in expected:
        assert params[pid].tobytes() == expected[pid].tobytes(), f"param {pid} differs"
    for client in first + fresh:
        client.close()


def test_without_recovery_a_step_fails_at_once(group: SupervisedGroup) -> None:
    client = optstep.Client(rank_targets=group.targets, recovery_timeout=0)
    info, _ = client.create_session(pb.SessionSpec(
        name="no-recovery", num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
        parameters=[pb.ParameterSpec(name="w", shape=[4])],
        optimizer=config.chain(config.adamw())))
    client.step(info.session_id, 1, {"w": np.ones(4, np.float32)})
    group.kill(0, 1)
    with pytest.raises(optstep.UnavailableError):
        client.step(info.session_id, 2, {"w": np.ones(4, np.float32)})
    client.close()


def _step_once(model: nn.Module, opt: RemoteOptimizer) -> None:
    """The next step without the loop's handling of RewindRequired, to see what it raises."""
    x, y = batch(opt.next_step)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()


def test_a_group_restored_to_an_older_step_rewinds_the_trainer(
        server_binary: str, tmp_path: pathlib.Path) -> None:
    # The undisturbed run: the parameters after 3 and after 6 steps, and the state after 6.
    with optstep.LocalGroup(2, server_binary) as ranks, \
            optstep.Client(rank_targets=ranks.targets) as client:
        model = make_mlp(5)
        opt = RemoteOptimizer(model, client, optimizer=config.muon_chain(lr=0.02))
        after: Dict[int, Dict[str, torch.Tensor]] = {}
        train_steps(model, opt, 6, after_step=lambda s: after.__setitem__(
            s, parameters_of(model)))
        expected_state = opt.state_dict()["state"]

    rewinds: List[int] = []
    # Automatic checkpoints after steps 1, 3, 5, ...: killed after step 4, it comes back at 3.
    with SupervisedGroup(server_binary, 2, tmp_path, every_steps=2) as group, \
            optstep.Client(rank_targets=group.targets, recovery_timeout=60) as client:
        model = make_mlp(5)
        opt = RemoteOptimizer(model, client, optimizer=config.muon_chain(lr=0.02),
                              on_rewind=rewinds.append)
        # Rank 0 saves the step it finds when a save is due: each save is awaited, so that the
        # steps saved are 1 and 3.
        for step in (1, 3):
            train_steps(model, opt, step)
            group.await_checkpoint(opt.session_id, step)
        train_steps(model, opt, 4)
        group.kill(0, 1)
        with pytest.raises(optstep.RewindRequired) as raised:
            _step_once(model, opt)
        assert raised.value.step == 3 and raised.value.next_step == 4
        assert rewinds == [3] and opt.next_step == 4
        assert_bit_identical(parameters_of(model), after[3], "model after the rewind")
        assert train_steps(model, opt, 6) == []
        assert_bit_identical(parameters_of(model), after[6], "parameters")
        assert_bit_identical(state_of(opt), expected_state, "optimizer state")
