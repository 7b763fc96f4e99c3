"""RemoteOptimizer: a torch.optim.Optimizer whose steps run on an optstep server.

    model = Net()
    client = optstep.Client("localhost:50051")
    opt = RemoteOptimizer(model, client, optimizer=optstep.config.muon_chain(lr=0.02))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()            # pushes the gradients, writes the updated parameters back
        sched.step()

Construction registers the model (a session; see :func:`describe_parameters` for how the
parameters are declared and routed), or attaches to the session of the same name when another
trainer created it. ``param_groups`` are the server's hyperparameter groups (one per
sub-optimizer and override set); each step sends every group's current ``lr`` and
``weight_decay``, so learning-rate schedulers work unchanged.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import (Any, Callable, ContextManager, Dict, Iterable, List, Mapping, Optional,
                    Union)

import numpy as np
import torch
from torch import nn

from optstep import dtypes
from optstep.chunks import GradientSlice
from optstep.client import Client, GroupSchedule, StepReply
from optstep.errors import (CancelledError, DataLossError, DeadlineExceededError,
                            FailedPreconditionError, InternalError, OptstepError,
                            UnavailableError, UnknownError)
from optstep.recovery import RewindRequired
from optstep.streamed_step import StreamedStep
from optstep.torch.model_spec import NamedParams, ParamDescription, QkvLike, describe_parameters
from optstep.torch.overlap import BackwardOverlap
from optstep.v1 import optimizer_config_pb2, session_pb2

#: The errors a step may end with after it wrote some of the returned parameters into the model
#: (param_out): the stream broke, or its recovery gave up, while they came. (A step the server
#: aborted, or one refused before it was sent, wrote none.)
_MAY_HAVE_WRITTEN = (CancelledError, DataLossError, DeadlineExceededError, InternalError,
                     UnavailableError, UnknownError)

__all__ = ["RemoteOptimizer"]

_MODES = {"sharded": session_pb2.GRADIENT_MODE_SHARDED,
          "replicated": session_pb2.GRADIENT_MODE_REPLICATED}
# Keys of a param group that name the server group; the rest are hyperparameters.
_IDENTITY_KEYS = ("params", "param_names", "group_id", "sub_optimizer", "wd_mult")


def with_clipping(optimizer: Union[optimizer_config_pb2.OptimizerConfig, str],
                  clip_grad: Optional[float]) -> optimizer_config_pb2.OptimizerConfig:
    """`optimizer` (a config or a preset name) with torch's clipping semantics: a chain that
    does not set ``clip_grad`` clips nothing unless `clip_grad` is given; a preset keeps
    Megatron's 1.0 unless `clip_grad` is given. ValueError when a chain's own ``clip_grad`` and
    `clip_grad` disagree."""
    config = optimizer_config_pb2.OptimizerConfig()
    if isinstance(optimizer, str):
        config.preset = optimizer
    else:
        config.CopyFrom(optimizer)
    if config.preset:
        if clip_grad is not None:
            config.megatron_args["clip_grad"] = repr(float(clip_grad))
    elif clip_grad is None:
        if not config.HasField("clip_grad"):
            config.clip_grad = 0.0
    elif config.HasField("clip_grad") and config.clip_grad != clip_grad:
        raise ValueError(f"clip_grad={clip_grad} and the chain's clip_grad {config.clip_grad} "
                         "disagree; give one")
    else:
        config.clip_grad = clip_grad
    return config


def to_tensor(values: np.ndarray) -> torch.Tensor:
    """A torch view of a returned array (float32, or uint16 bf16 bits → bfloat16)."""
    if values.dtype == np.uint16:
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)


class RemoteOptimizer(torch.optim.Optimizer):
    """A torch optimizer that delegates each step to an optstep session.

    Args:
      params: an ``nn.Module`` (enables embedding/output and QKV detection) or (name, tensor)
        pairs, e.g. ``model.named_parameters()``.
      client: a connected :class:`optstep.Client`.
      optimizer: the session's optimizer: an ``OptimizerConfig`` (see :mod:`optstep.config`) or
        a Megatron preset name ("adam", "sgd", "muon", ...).
      clip_grad: the global gradient-norm clip. None: as torch optimizers, no clipping for a
        chain (unless the chain sets its own ``clip_grad``), Megatron's 1.0 for a preset.
        <= 0 disables it.
      session_name: names the session so that other trainers (and restarts) attach to it;
        required with several trainers. Default: a fresh unique name.
      trainer_id, num_trainers: this trainer and how many push gradients per step.
      gradient_mode: "replicated" (each trainer sends its full gradients; the server averages)
        or "sharded" (gradients already averaged; trainer t sends elements
        ``[t·n/N, (t+1)·n/N)`` of every parameter's flattened gradient).
      embedding_or_output, detect_output, qkv, model_chunk, expert: parameter declarations, see
        :func:`optstep.torch.describe_parameters`.
      grad_dtype: send gradients as "fp32", "bf16" or "fp16" (default: their own dtype).
      return_dtype: "fp32" or "bf16" (default: bf16 when every parameter is bf16, else fp32).
      step_deadline_ms: the session's step deadline (0: the server's default).
      on_rewind: called with the restored step when the server group came back at an older
        step than this optimizer's (see :meth:`step`), before RewindRequired is raised.
      overlap: send each gradient while backward still runs, in buckets of about
        `bucket_bytes` (:mod:`optstep.torch.overlap`); with an ``nn.Module``, ``step()`` then
        returns at once and the model's forward waits for the updated parameters (errors are
        raised there, or by :meth:`synchronize`). Micro-batches that do not step go under
        :meth:`no_sync`. Call :meth:`synchronize` before reading ``last_step`` or the state.

    Every trainer of a session must start from the same initial values (the same seed), as
    with DistributedDataParallel: each sends them before its first step and the first to
    begin stepping has set them. A trainer that attaches to a session that has already run
    takes the session's current parameters.

    After each step, ``last_step`` holds the server's answer (step, skipped, grad_norm,
    clipped). A skipped step (non-finite gradients) changes nothing; by the spec's convention
    the schedule should not advance then.
    """

    def __init__(self, params: Union[nn.Module, NamedParams], client: Client, *,
                 optimizer: Union[optimizer_config_pb2.OptimizerConfig, str],
                 session_name: Optional[str] = None, trainer_id: int = 0,
                 num_trainers: int = 1, gradient_mode: str = "replicated",
                 embedding_or_output: Union[None, Iterable[str], Mapping[str, bool]] = None,
                 detect_output: bool = True, qkv: Optional[Mapping[str, QkvLike]] = None,
                 model_chunk: Union[int, Mapping[str, int]] = 0, expert: Iterable[str] = (),
                 grad_dtype: Optional[dtypes.DTypeLike] = None,
                 return_dtype: Optional[dtypes.DTypeLike] = None,
                 step_deadline_ms: int = 0,
                 on_rewind: Optional[Callable[[int], None]] = None,
                 clip_grad: Optional[float] = None, overlap: bool = False,
                 bucket_bytes: int = 25 << 20) -> None:
        if gradient_mode not in _MODES:
            raise ValueError(f"gradient_mode {gradient_mode!r} is not one of {sorted(_MODES)}")
        if num_trainers > 1 and not session_name:
            raise ValueError("several trainers need a session_name to meet in one session")
        if not 0 <= trainer_id < num_trainers:
            raise ValueError(f"trainer_id {trainer_id} is outside [0, {num_trainers})")
        described = describe_parameters(params, embedding_or_output=embedding_or_output,
                                        detect_output=detect_output, qkv=qkv,
                                        model_chunk=model_chunk, expert=expert)
        if not described:
            raise ValueError("RemoteOptimizer got no trainable parameter")
        optimizer = with_clipping(optimizer, clip_grad)
        spec = session_pb2.SessionSpec(
            name=session_name or f"torch-{uuid.uuid4().hex[:12]}",
            parameters=[d.spec for d in described], optimizer=optimizer,
            num_trainers=num_trainers, gradient_mode=_MODES[gradient_mode],
            step_deadline_ms=step_deadline_ms)

        self._client = client
        self._described: List[ParamDescription] = described
        self._trainer_id = trainer_id
        self._num_trainers = num_trainers
        self._sharded = gradient_mode == "sharded"
        self._grad_dtype = grad_dtype
        all_bf16 = all(d.tensor.dtype == torch.bfloat16 for d in described)
        self._return_dtype = return_dtype or ("bf16" if all_bf16 else "fp32")
        self.last_step: Optional[StepReply] = None
        self._on_rewind = on_rewind
        # A rewind whose pull of the restored parameters failed: the model still holds the
        # parameters of before it, so the next step pulls them and asks for the rewind again.
        self._restore_missed = False

        info, attached = client.create_session(spec)
        self.session_id: str = info.session_id
        self.attached: bool = attached
        self._next_step = info.step + 1
        super().__init__(self._torch_groups(info), defaults={})
        self._constructed = True
        self._overlap: Optional[BackwardOverlap] = None
        if info.step > 0:  # attached to a session that has run: continue from its values
            self._pull()
            self._holds_step(info.step)
        else:
            try:
                client.init_parameters(self.session_id,
                                       {i: d.tensor for i, d in enumerate(described)})
            except FailedPreconditionError:
                if num_trainers == 1 and not attached:
                    raise
                # Another trainer has begun step 1, after setting the (same) initial values; or
                # this trainer, restarted, attached to its session whose step 1 a lost rank
                # interrupted after some ranks applied it (the session still reads step 0): the
                # values were set by the run that made the session, and the step is redone.
            except Exception:
                if not attached:  # do not leave a session nobody can use; report the first error
                    with contextlib.suppress(OptstepError):
                        client.close_session(self.session_id)
                raise
        # Last: a constructor that raised leaves no hooks on the model (they would step a session
        # this optimizer never got to use at every later backward).
        if overlap:
            self._overlap = BackwardOverlap(
                self, [d.tensor for d in described],
                params if isinstance(params, nn.Module) else None, bucket_bytes)

    def _torch_groups(self, info: session_pb2.SessionInfo) -> List[Dict[str, Any]]:
        groups = []
        for group in info.groups:
            groups.append({
                "params": [(self._described[i].name, self._described[i].tensor)
                           for i in group.param_ids],
                "lr": group.lr,
                "weight_decay": group.weight_decay,
                "group_id": group.id,
                "sub_optimizer": group.sub_optimizer,
                "wd_mult": group.wd_mult,
            })
        return groups

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if getattr(self, "_constructed", False):
            raise NotImplementedError("RemoteOptimizer: the session's parameters are fixed at "
                                      "construction; create a new optimizer for new ones")
        super().add_param_group(param_group)

    @property
    def client(self) -> Client:
        return self._client

    @property
    def next_step(self) -> int:
        """The number of the step the next ``step()`` applies."""
        return self._next_step

    @property
    def parameter_names(self) -> List[str]:
        """The session's parameter names, by parameter id."""
        return [d.name for d in self._described]

    # ---- stepping

    def _gradient_slices(self, ids: Iterable[int]) -> List[GradientSlice]:
        """This trainer's gradient slices of parameters `ids` (all of each, or its share)."""
        slices = []
        for i in ids:
            grad = self._described[i].tensor.grad
            if grad is None:  # an unused parameter: its gradient is zero (spec §1.4)
                grad = torch.zeros_like(self._described[i].tensor, dtype=torch.float32,
                                        device="cpu")
            if self._sharded:
                n, t, k = grad.numel(), self._trainer_id, self._num_trainers
                begin, end = t * n // k, (t + 1) * n // k
                if begin < end:
                    slices.append(GradientSlice(i, grad.reshape(-1)[begin:end], begin,
                                                self._grad_dtype))
            else:
                slices.append(GradientSlice(i, grad, 0, self._grad_dtype))
        return slices

    def _schedule(self) -> List[GroupSchedule]:
        return [GroupSchedule(g["group_id"], float(g["lr"]), float(g["weight_decay"]))
                for g in self.param_groups]

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Pushes this trainer's gradients for the next step, waits for the step to run on the
        server, and writes the updated parameters into the model. Answers the closure's loss.
        Raises the client's errors (e.g. AbortedError: redo the step).

        While the server group recovers from a failure the step waits for it (the client's
        ``recovery_timeout``) and completes by itself. When the group came back at an older
        step (restored from a checkpoint), the model takes the restored parameters,
        ``next_step`` becomes the restored step + 1, ``on_rewind(step)`` is called, and
        :class:`optstep.RewindRequired` is raised: the loop rewinds its data to that step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._overlap is not None:
            self._overlap.finish()
            return loss
        self._restore_if_missed()
        direct = self._param_out()
        try:
            reply = self._client.step(self.session_id, self._next_step,
                                      self._gradient_slices(range(len(self._described))),
                                      trainer_id=self._trainer_id, groups=self._schedule(),
                                      return_dtype=self._return_dtype, param_out=direct)
        except RewindRequired as rewind:
            self._rewound(rewind)
            raise
        except _MAY_HAVE_WRITTEN:
            self._restore_missed = bool(direct)
            raise
        self._applied(reply)
        return loss

    def _applied(self, reply: StepReply) -> None:
        self._next_step = reply.step + 1
        self._write(reply.params)
        reply.params = {}
        self.last_step = reply

    def _rewound(self, rewind: RewindRequired) -> None:
        """The group restored the session: the step counter and the training loop (on_rewind;
        the caller raises `rewind`) go back to its step, and the model takes its parameters. A
        failed pull does not hide the rewind (it becomes the rewind's cause): the next step pulls
        them again (_restore_if_missed)."""
        self._next_step = rewind.next_step
        try:
            self._pull()
            self._holds_step(rewind.step)
            self._restore_missed = False
        except OptstepError as error:
            self._restore_missed = True
            rewind.__cause__ = error
        if self._on_rewind is not None:
            self._on_rewind(rewind.step)

    def _restore_if_missed(self) -> None:
        """The model may not hold the session's parameters: after a rewind whose pull failed, or
        after a step that failed once it may have written some of its parameters into the model
        (_MAY_HAVE_WRITTEN). The gradients at hand were computed from such parameters: pulls the
        session's (its error is raised as is), takes the session's step, and raises the rewind
        to it, so that the loop redoes the batch on the model the session has (the failed step
        itself may have been applied before its answer broke)."""
        if not self._restore_missed:
            return
        pulled = self._client.pull_parameters(self.session_id, self._return_dtype)
        self._write(pulled.params)
        self._restore_missed = False
        failed_step = self._next_step
        self._next_step = pulled.step + 1
        # Also when the failed step was applied after all: a later rollback to the step before
        # it is a rewind.
        self._holds_step(pulled.step)
        rewind = RewindRequired(self.session_id, pulled.step, failed_step)
        if self._on_rewind is not None:
            self._on_rewind(rewind.step)
        raise rewind

    # ---- overlap=True (optstep.torch.overlap)

    def no_sync(self) -> ContextManager[None]:
        """With ``overlap=True``, backward passes inside send nothing (the micro-batches of a
        gradient accumulation that do not step); without it, does nothing."""
        return self._overlap.no_sync() if self._overlap is not None else contextlib.nullcontext()

    def synchronize(self) -> None:
        """Waits for a step that resolves in the background (``overlap=True`` with a module)
        and raises its error; forward passes of the model wait by themselves."""
        if self._overlap is not None:
            self._overlap.wait()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:  # in place: the gradients may still be on their way
            self.synchronize()
        if self._overlap is not None:
            self._overlap.discard()  # a backward that did not reach step(): its step goes
        super().zero_grad(set_to_none)

    def _open_step(self) -> StreamedStep:
        self._restore_if_missed()
        return self._client.open_step(self.session_id, self._next_step,
                                      trainer_id=self._trainer_id, groups=self._schedule(),
                                      return_dtype=self._return_dtype)

    def _advance(self) -> None:
        """The step in flight is committed: the next one gets the next number."""
        self._next_step += 1

    def _resolve(self, step: StreamedStep,
                 on_ready: Optional[Callable[[int], None]] = None) -> StepReply:
        """Waits for an overlapped step; `on_ready(i)` as parameter i is in the model (those
        written straight into the model's tensors; the others once the step is applied)."""
        direct = self._param_out()
        reply = step.finish(direct, on_ready and (lambda i: on_ready(i) if i in direct else None))
        self._applied(reply)
        return reply

    def _failed(self, error: BaseException) -> None:
        """Raises the error of a step that resolved in the background. It may come out of the
        next iteration's forward or backward: it carries ``failed_step``, the step to redo, which
        is ``next_step`` again (a loop that redid its current batch would skip that step's)."""
        if isinstance(error, RewindRequired):
            self._rewound(error)
        else:
            self._restore_missed |= isinstance(error, _MAY_HAVE_WRITTEN) and bool(self._param_out())
            self._next_step -= 1  # redo it
            setattr(error, "failed_step", self._next_step)
        raise error

    def _param_out(self) -> Dict[int, torch.Tensor]:
        """The model tensors the step writes the returned parameters into directly: contiguous
        CPU tensors of the return dtype (the others are copied, converted, by _write)."""
        want = torch.bfloat16 if dtypes.wire_dtype(self._return_dtype) == dtypes.BF16 \
            else torch.float32
        return {i: d.tensor for i, d in enumerate(self._described)
                if d.tensor.device.type == "cpu" and d.tensor.dtype == want
                and d.tensor.is_contiguous()}

    @torch.no_grad()
    def _write(self, params: Mapping[int, np.ndarray]) -> None:
        for pid, values in params.items():
            tensor = self._described[pid].tensor
            tensor.copy_(to_tensor(values).view(tensor.shape))

    def _pull(self) -> None:
        pulled = self._client.pull_parameters(self.session_id, self._return_dtype)
        self._write(pulled.params)

    def _holds_step(self, step: int) -> None:
        """The model holds the session's parameters of `step`, pulled: a step refused later
        because the session is behind it is a rollback (a rewind), also before this trainer's
        first step of its own (it attached, or loaded a state dict)."""
        self._client.state_replaced(self.session_id, step, self._trainer_id)

    # ---- state dicts

    def state_dict(self) -> Dict[str, Any]:
        """The session's state through the server's ExportStateDict: ``state`` maps the
        server's keys ("param/<name>", "state/<sub-optimizer>/<name>/<key>") to CPU tensors;
        ``param_groups`` hold each group's hyperparameters (lr, weight_decay, what schedulers
        add) and parameter indices; ``step`` is the number of steps applied.

        Before the first step (frameworks such as Accelerate save and load the optimizer once at
        start-up) nothing is asked of the server: ``state`` is empty, as a torch optimizer's is
        before its first step, and :meth:`load_state_dict` of such a dict sends nothing.
        With ``overlap=True`` it waits for the step in flight first (and raises its error)."""
        self.synchronize()
        stepped = self._next_step > 1
        state = self._client.export_state_dict(self.session_id) if stepped else {}
        groups = []
        index = {id(d.tensor): i for i, d in enumerate(self._described)}
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = [index[id(p)] for p in group["params"]]
            groups.append(saved)
        return {"state": {key: to_tensor(value) for key, value in state.items()},
                "param_groups": groups, "step": self._next_step - 1}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict` through ImportStateDict: the server's masters and
        optimizer state, the groups' hyperparameters, then the model's parameters (pulled
        from the server) and the step counter (the session's). With ``overlap=True`` it waits
        for the step in flight first, whose end would otherwise move the step counter on."""
        self.synchronize()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state dict has {len(groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for saved, group in zip(groups, self.param_groups):
            for key in ("group_id", "sub_optimizer"):
                if saved.get(key) != group[key]:
                    raise ValueError(f"state dict group {saved.get('group_id')} has {key} "
                                     f"{saved.get(key)!r}, this optimizer {group[key]!r}")
        unstepped = not state_dict["state"] and state_dict.get("step", 0) == 0
        if unstepped and self._next_step > 1:
            raise ValueError(f"state dict of an optimizer before its first step; session "
                             f"'{self.session_id}' has applied {self._next_step - 1} steps")
        if not unstepped:  # saved before the first step: nothing to send to an unstepped session
            self._client.import_state_dict(self.session_id, {
                key: (value.detach().cpu() if isinstance(value, torch.Tensor) else value)
                for key, value in state_dict["state"].items()})
            # Until the model holds the imported parameters: a read or pull that fails below
            # leaves the next step to pull them and rewind to the session's step, rather than
            # send gradients of the parameters from before the import.
            self._restore_missed = True
        for saved, group in zip(groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k not in _IDENTITY_KEYS})
        if not unstepped:
            step = self._client.get_session(self.session_id).step
            self._pull()
            self._next_step = step + 1
            self._holds_step(step)
            self._restore_missed = False  # the model holds the session's parameters

    def close_session(self) -> None:
        """Drops the session on the server (for the last trainer of a job); with
        ``overlap=True``, takes the hooks off the model first (another optimizer may train it)."""
        try:
            if self._overlap is not None:
                self._overlap.remove()  # raises the error of a step in flight, hooks removed
        finally:
            self._client.close_session(self.session_id)
