"""RemoteOptimizer(overlap=True): gradients sent while backward runs, the step resolved in the
background, the model's forward waiting for the parameters. Bit-identical to overlap=False, on
the native data path and the pure-Python one, with gradient accumulation and several trainers."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from typing import Any, Callable, Dict, List

import pytest
import torch
from torch import nn

import optstep
from optstep import config, native
from optstep.torch import RemoteOptimizer
from repository import native_library_path
from support import loss_of, make_data, make_mlp

STEPS = 4


def _optimizer() -> Any:
    return config.chain(config.adamw(lr=1e-2, weight_decay=0.1))


def _train(model: nn.Module, opt: RemoteOptimizer, x: torch.Tensor, y: torch.Tensor,
           micro_batches: int = 1) -> None:
    """STEPS steps; each accumulates `micro_batches` micro-batches, all but the last under
    no_sync."""
    for _ in range(STEPS):
        opt.zero_grad()
        for m, (xs, ys) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches))):
            if m < micro_batches - 1:
                with opt.no_sync():
                    loss_of(model, xs, ys).backward()
            else:
                loss_of(model, xs, ys).backward()
        opt.step()
    opt.synchronize()


def _assert_identical(a: nn.Module, b: nn.Module, start: nn.Module) -> None:
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), start.parameters()):
        assert torch.equal(pa, pb), f"param '{name}' differs"
        assert not torch.equal(pa, p0), f"param '{name}' did not change"


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_overlap_is_bit_identical(client: optstep.Client, path: str,
                                  micro_batches: int) -> None:
    x, y = make_data(11, n=48)
    start = make_mlp(12)
    models = {}
    for overlap in (False, True):
        model = copy.deepcopy(start)
        opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=overlap,
                              bucket_bytes=512)
        _train(model, opt, x, y, micro_batches)
        assert opt.next_step == STEPS + 1 and opt.last_step is not None
        assert opt.last_step.step == STEPS
        opt.close_session()
        models[overlap] = model
    _assert_identical(models[True], models[False], start)


def test_a_constructor_that_fails_leaves_no_hooks_on_the_model(
        client: optstep.Client, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An overlapped optimizer whose construction fails (its initial values not sent: a rank
    away) leaves the model to the next one. Before, its hooks stayed on the model, and every
    later backward stepped the session it closed."""
    x, y = make_data(6, n=16)
    model = make_mlp(4)

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise optstep.UnavailableError("rank 1 is away")

    with monkeypatch.context() as patched:
        patched.setattr(client, "init_parameters", unreachable)
        with pytest.raises(optstep.UnavailableError):
            RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    loss_of(model, x, y).backward()  # no hook of the failed optimizer runs
    second = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    _train(model, second, x, y)
    assert second.last_step is not None and second.last_step.step == STEPS
    second.close_session()


def test_a_closed_session_leaves_the_model_to_another_optimizer(client: optstep.Client,
                                                                path: str) -> None:
    x, y = make_data(5, n=16)
    model = make_mlp(3)
    first = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    _train(model, first, x, y)
    first.close_session()  # its hooks go with it: they would step the closed session
    second = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    _train(model, second, x, y)
    assert second.last_step is not None and second.last_step.step == STEPS
    second.close_session()


def test_gradients_leave_during_backward(client: optstep.Client, path: str) -> None:
    """Every complete bucket is added to the step's stream by the backward pass itself; with
    the native library its bytes are on their way before step() is called."""
    x, y = make_data(13)
    model = make_mlp(14)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True, bucket_bytes=256)
    overlap = opt._overlap
    assert overlap is not None and overlap.bucket_count > 2
    added: List[int] = []
    real_add = optstep.streamed_step.StreamedStep.add

    def add(self: Any, gradients: Any) -> None:
        added.append(len(gradients))
        real_add(self, gradients)

    try:
        optstep.streamed_step.StreamedStep.add = add  # type: ignore[method-assign]
        loss_of(model, x, y).backward()
        assert len(added) == overlap.bucket_count  # one add per bucket, during backward
        assert sum(added) == len(list(model.parameters()))
        assert overlap._step is not None and overlap._step.native == (path == "native")
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        assert len(added) == overlap.bucket_count + 1  # step() adds what is left: nothing here
        assert added[-1] == 0
        model(x)  # the forward pre-hooks wait for the step's parameters
        assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        opt.synchronize()  # last_step is set once the whole reply is in
        assert opt.last_step is not None and opt.last_step.step == 1
    finally:
        optstep.streamed_step.StreamedStep.add = real_add  # type: ignore[method-assign]
    opt.close_session()


def test_a_second_backward_without_no_sync_is_refused(client: optstep.Client,
                                                      path: str) -> None:
    x, y = make_data(15)
    model = make_mlp(16)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    loss_of(model, x, y).backward()
    with pytest.raises(RuntimeError, match="no_sync"):
        loss_of(model, x, y).backward()
    opt.close_session()


def test_named_parameters_step_at_once(client: optstep.Client, path: str) -> None:
    """Without a module there are no forward hooks: step() waits for the parameters."""
    x, y = make_data(17)
    start = make_mlp(18)
    models = []
    for overlap in (False, True):
        model = copy.deepcopy(start)
        opt = RemoteOptimizer(model.named_parameters(), client, optimizer=_optimizer(),
                              overlap=overlap)
        for _ in range(2):
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
            assert opt.last_step is not None and opt.next_step == opt.last_step.step + 1
        opt.close_session()
        models.append(model)
    _assert_identical(models[1], models[0], start)


def test_a_failed_step_without_a_module_is_redone_under_its_number(
        client: optstep.Client, path: str) -> None:
    """A step that fails as step() resolves it at once keeps its number: redoing it applies it,
    as a step resolved in the background does."""
    x, y = make_data(17)
    model = make_mlp(18)
    opt = RemoteOptimizer(model.named_parameters(), client, optimizer=_optimizer(), overlap=True)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    assert opt.next_step == 2

    def fails(step: Any, on_ready: Any = None) -> Any:
        step.close()  # nothing is applied
        raise optstep.AbortedError("the step was aborted; redo it")

    setattr(opt, "_resolve", fails)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    with pytest.raises(optstep.AbortedError):
        opt.step()
    assert opt.next_step == 2
    delattr(opt, "_resolve")
    opt.step()  # the same gradients again
    assert opt.last_step is not None and opt.last_step.step == 2 and opt.next_step == 3
    opt.close_session()


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_two_trainers_overlapped(client: optstep.Client, path: str, mode: str) -> None:
    """Two trainers (threads) with overlap=True end where two with overlap=False end."""
    start = make_mlp(19)
    results = {}
    for overlap in (False, True):
        name = f"overlap-{mode}-{overlap}-{uuid.uuid4().hex[:8]}"
        models = [copy.deepcopy(start) for _ in range(2)]
        opts = [RemoteOptimizer(models[t], client, optimizer=_optimizer(), session_name=name,
                                trainer_id=t, num_trainers=2, gradient_mode=mode,
                                overlap=overlap, bucket_bytes=512) for t in range(2)]
        errors: List[BaseException] = []

        def trainer(t: int) -> None:
            try:
                x, y = make_data(20 if mode == "sharded" else 20 + t, n=32)
                _train(models[t], opts[t], x, y)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=trainer, args=(t,)) for t in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        _assert_identical(models[0], models[1], start)  # both trainers take the same values
        opts[0].close_session()
        results[overlap] = models[0]
    _assert_identical(results[True], results[False], start)


def test_parameters_are_announced_one_by_one(client: optstep.Client,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """On the native path each parameter is announced as soon as it is in the model, so that a
    module's forward waits for its own parameters only."""
    monkeypatch.setenv("OPTSTEP_NATIVE", "1")
    if not native.library_path().is_file():
        monkeypatch.setenv("OPTSTEP_NATIVE_LIB", native_library_path())
    announced: List[int] = []
    real_finish = native.NativeStepStream.finish

    def finish(self: Any, param_out: Any, on_ready: Any = None) -> Any:
        def ready(i: int) -> None:
            announced.append(i)
            on_ready(i)

        return real_finish(self, param_out, ready if on_ready is not None else None)

    monkeypatch.setattr(native.NativeStepStream, "finish", finish)
    x, y = make_data(21)
    model = make_mlp(22)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    loss_of(model, x, y).backward()
    opt.step()
    model(x)
    opt.synchronize()
    assert sorted(announced) == list(range(len(list(model.parameters()))))
    opt.close_session()


def _full_step(model: nn.Module, opt: RemoteOptimizer, x: torch.Tensor,
               y: torch.Tensor) -> Callable[[], None]:
    """One whole step: backward, step() and the wait for its end."""
    def step() -> None:
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        opt.synchronize()
    return step


def _holds(model: nn.Module, params: Dict[int, Any]) -> bool:
    """Whether the model's parameters are `params` (by index), bit for bit."""
    return all(torch.equal(p.detach(), torch.from_numpy(params[i]).reshape(p.shape))
               for i, p in enumerate(model.parameters()))


def _rolled_back_to_step_two(client: optstep.Client, opt: RemoteOptimizer,
                             step: Callable[[], None], address: str) -> Dict[int, Any]:
    """Steps 1-4, then the session's state after step 2 imported back by another client (at
    `address`), as a restore from a checkpoint does; answers the parameters after step 2. (An
    import of the trainer's own client is no rewind to it: it knows the session's step.)"""
    step()
    step()
    saved = client.export_state_dict(opt.session_id)
    pulled = {i: v.copy() for i, v in client.pull_parameters(opt.session_id).params.items()}
    step()
    step()
    with optstep.Client(address) as restorer:
        restorer.import_state_dict(opt.session_id, saved)
    return pulled


def test_a_session_rolled_back_between_steps_rewinds_an_overlapped_trainer(
        server: optstep.LocalServer, client: optstep.Client, path: str) -> None:
    """The group came back at an older step while the trainer was between steps (its state
    imported, as a restore from a checkpoint does): the next overlapped step is answered out of
    sequence, and the optimizer rewinds as without overlap (parameters pulled, on_rewind,
    RewindRequired), instead of raising FailedPreconditionError for ever."""
    x, y = make_data(31)
    model = make_mlp(32)
    rewound: List[int] = []
    opt = RemoteOptimizer(model.named_parameters(), client, optimizer=_optimizer(),
                          overlap=True, on_rewind=rewound.append)

    step = _full_step(model, opt, x, y)
    pulled = _rolled_back_to_step_two(client, opt, step, server.address)
    with pytest.raises(optstep.RewindRequired) as raised:
        step()
    assert raised.value.step == 2 and rewound == [2] and opt.next_step == 3
    assert _holds(model, pulled), "the model did not take the restored parameters"
    step()  # the loop redoes step 3
    assert opt.last_step is not None and opt.last_step.step == 3
    opt.close_session()


def test_a_state_dict_loaded_while_a_step_resolves_keeps_its_step(
        client: optstep.Client, path: str) -> None:
    """load_state_dict right after an overlapped step() (as a framework restoring a checkpoint
    does): it waits for the step in flight, whose end would otherwise set the step counter past
    the loaded one."""
    x, y = make_data(41)
    model = make_mlp(42)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)

    def step() -> None:
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()

    step()
    step()
    opt.synchronize()
    saved = opt.state_dict()
    assert saved["step"] == 2
    resolve = opt._resolve

    def slowly(streamed: Any, on_ready: Any = None) -> Any:
        time.sleep(0.5)  # the step's answer is slow to come
        return resolve(streamed, on_ready)

    setattr(opt, "_resolve", slowly)
    step()  # step 3 resolves in the background
    opt.load_state_dict(saved)
    opt.synchronize()
    assert opt.next_step == 3, "the step in flight moved the loaded step counter on"
    delattr(opt, "_resolve")
    step()
    opt.synchronize()
    assert opt.last_step is not None and opt.last_step.step == 3
    opt.close_session()



@pytest.mark.parametrize("overlap", [False, True])
def test_a_rewind_whose_pull_fails_is_still_a_rewind(server: optstep.LocalServer,
                                                     client: optstep.Client, path: str,
                                                     overlap: bool) -> None:
    """The session was restored to an older step and the pull of its parameters fails: the loop
    still gets RewindRequired (the pull's error as its cause) and the step counter goes back; the
    next step pulls the parameters and asks for the rewind again, since its gradients came from
    the parameters of before; the one after that is applied, instead of FailedPreconditionError
    for ever."""
    x, y = make_data(51)
    model = make_mlp(52)
    rewound: List[int] = []
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=overlap,
                          on_rewind=rewound.append)

    step = _full_step(model, opt, x, y)
    pulled = _rolled_back_to_step_two(client, opt, step, server.address)
    pull = client.pull_parameters

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise optstep.UnavailableError("rank 0 is not reachable")

    setattr(client, "pull_parameters", unreachable)
    with pytest.raises(optstep.RewindRequired) as raised:
        step()
    assert raised.value.step == 2 and rewound == [2] and opt.next_step == 3
    assert isinstance(raised.value.__cause__, optstep.UnavailableError)
    setattr(client, "pull_parameters", pull)
    with pytest.raises(optstep.RewindRequired) as again:
        step()
    assert again.value.step == 2 and rewound == [2, 2] and opt.next_step == 3
    assert _holds(model, pulled), "the model did not take the restored parameters"
    step()  # the loop redoes step 3
    assert opt.last_step is not None and opt.last_step.step == 3
    opt.close_session()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_step_that_broke_while_writing_the_model_makes_the_next_one_pull(
        client: optstep.Client, path: str, overlap: bool) -> None:
    """A step whose answer broke after it wrote some parameters into the model (its recovery
    gave up) leaves the model mixed: the next step pulls the session's parameters and raises
    RewindRequired at the session's step, so that the loop redoes the batch on them, rather than
    send gradients computed on the mixed model. Before, the next step sent them."""
    x, y = make_data(91)
    model = make_mlp(92)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=overlap)
    step = _full_step(model, opt, x, y)
    step()

    def broke(param_out: Dict[int, torch.Tensor]) -> None:
        with torch.no_grad():
            for tensor in list(param_out.values())[:1]:
                tensor.fill_(7.0)  # what came before the break
        raise optstep.UnavailableError("rank 1 is not reachable; recovery gave up")

    if overlap:
        def resolve(streamed: Any, on_ready: Any = None) -> Any:
            streamed.close()
            broke(opt._param_out())

        setattr(opt, "_resolve", resolve)
    else:
        real_step = client.step
        setattr(client, "step", lambda *args, **kwargs: broke(kwargs["param_out"]))
    with pytest.raises(optstep.UnavailableError):
        step()
    if overlap:
        delattr(opt, "_resolve")
    else:
        setattr(client, "step", real_step)
    with pytest.raises(optstep.RewindRequired) as raised:
        step()
    assert raised.value.step == 1 and opt.next_step == 2
    session = client.pull_parameters(opt.session_id).params
    assert _holds(model, session), "the model does not hold the session's parameters"
    step()  # the loop redoes step 2
    assert opt.last_step is not None and opt.last_step.step == 2
    opt.close_session()


def _break_next_step(client: optstep.Client) -> Callable[[], None]:
    """The next client.step writes 7s into the first parameter and raises UnavailableError, as a
    step whose answer broke part way; answers the undo."""
    real_step = client.step

    def broke(*args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            next(iter(kwargs["param_out"].values())).fill_(7.0)
        raise optstep.UnavailableError("rank 1 is not reachable; recovery gave up")

    setattr(client, "step", broke)
    return lambda: setattr(client, "step", real_step)


def test_a_broken_step_after_the_group_came_back_older_tells_the_client(
        server: optstep.LocalServer, client: optstep.Client, path: str) -> None:
    """The group came back at step 2 while the trainer's step 5 broke: the rewind that follows
    tells the client the session's state is at step 2 (state_replaced), so that what it saw
    applied up to step 4 no longer counts; a load_state_dict after a broken step needs no pull."""
    x, y = make_data(93)
    model = make_mlp(94)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer())
    step = _full_step(model, opt, x, y)
    _rolled_back_to_step_two(client, opt, step, server.address)
    told: List[Any] = []
    state_replaced = client.state_replaced
    setattr(client, "state_replaced", lambda *args: (told.append(args), state_replaced(*args)))
    undo = _break_next_step(client)
    with pytest.raises(optstep.UnavailableError):
        step()
    undo()
    with pytest.raises(optstep.RewindRequired) as raised:
        step()
    assert raised.value.step == 2 and told == [(opt.session_id, 2, 0)]  # this trainer's alone
    step()
    saved = opt.state_dict()
    undo = _break_next_step(client)
    with pytest.raises(optstep.UnavailableError):
        step()
    undo()
    opt.load_state_dict(saved)
    step()  # no rewind: the load put the session's parameters into the model
    assert opt.last_step is not None and opt.last_step.step == 4
    opt.close_session()


def _failing_in_background(opt: RemoteOptimizer, gate: threading.Event) -> None:
    """Makes the next background step fail, its thread held open after the parameters are in
    until `gate` is set."""
    resolve = opt._overlap._resolve  # type: ignore[union-attr]

    def fails(step: Any, on_ready: Any = None) -> Any:
        step.close()  # nothing is applied
        raise optstep.AbortedError("the step was aborted; redo it")

    def held(streamed: Any) -> None:
        resolve(streamed)
        gate.wait(10)

    setattr(opt, "_resolve", fails)
    setattr(opt._overlap, "_resolve", held)


def test_a_failed_background_step_is_raised_by_the_next_forward(client: optstep.Client,
                                                                 path: str) -> None:
    """The docs promise the error of a step resolved in the background at the next forward: also
    while its thread has not ended yet, not a backward later (the forward would run on
    parameters of before the failed step)."""
    x, y = make_data(61)
    model = make_mlp(62)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    gate = threading.Event()
    _failing_in_background(opt, gate)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    try:
        with pytest.raises(optstep.AbortedError) as raised:
            model(x)
    finally:
        gate.set()
    assert opt.next_step == 1
    assert getattr(raised.value, "failed_step") == 1  # the step to redo, with its batch
    delattr(opt, "_resolve")
    delattr(opt._overlap, "_resolve")
    opt.close_session()


def test_closing_after_a_failed_background_step_closes(client: optstep.Client,
                                                       path: str) -> None:
    """close_session raises the error of the step in flight, and still takes the hooks off the
    model and drops the session."""
    x, y = make_data(71)
    model = make_mlp(72)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True)
    gate = threading.Event()
    gate.set()
    _failing_in_background(opt, gate)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    with pytest.raises(optstep.AbortedError):
        opt.close_session()
    assert opt._overlap is not None and opt._overlap._handles == []
    with pytest.raises(optstep.NotFoundError):
        client.get_session(opt.session_id)


def test_a_backward_that_raised_part_way_is_redone(client: optstep.Client, path: str) -> None:
    """A backward pass that raised after some gradients were sent (a hook of the user's, an
    out-of-memory error) leaves no step open: after zero_grad the loop redoes it, and the result
    is that of an uninterrupted run."""
    x, y = make_data(81)
    start = make_mlp(82)
    model, reference = copy.deepcopy(start), copy.deepcopy(start)
    opt = RemoteOptimizer(model, client, optimizer=_optimizer(), overlap=True, bucket_bytes=1)
    ref = RemoteOptimizer(reference, client, optimizer=_optimizer(), overlap=True)
    last = list(model.parameters())[0]  # its gradient comes last in backward

    def out_of_memory(grad: torch.Tensor) -> torch.Tensor:
        raise MemoryError("out of memory")

    hook = last.register_hook(out_of_memory)
    opt.zero_grad()
    with pytest.raises(MemoryError):
        loss_of(model, x, y).backward()
    hook.remove()
    _train(model, opt, x, y)
    _train(reference, ref, x, y)
    _assert_identical(model, reference, start)
    opt.close_session()
    ref.close_session()
