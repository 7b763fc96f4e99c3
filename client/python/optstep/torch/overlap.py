"""Gradients sent while backward runs: ``RemoteOptimizer(..., overlap=True)``.

Like DistributedDataParallel, the parameters are grouped into buckets of about ``bucket_bytes``,
in reverse order (backward reaches the last layers first). A post-accumulate-grad hook on each
parameter notes when autograd has accumulated its gradient; when a bucket is complete its
gradients are added to the step's stream (:meth:`optstep.Client.open_step`), which sends them
while backward goes on. ``step()`` adds what is left (parameters that got no gradient) and
commits; when the optimizer was given an ``nn.Module``, ``step()`` returns at once and the step
resolves in the background: with the native library the returned parameters are written into
the model's tensors as they arrive, and a forward pre-hook on every module that holds
parameters waits for its own parameters before the module runs (without the library, for the
whole step).

Gradient accumulation: the micro-batches that do not step run under :meth:`BackwardOverlap.no_sync`
(``opt.no_sync()``), where nothing is sent; the last one, outside it, sends the accumulated
gradients. Several trainers and sharded gradients work as with ``overlap=False``: each trainer
streams its own contribution. The parameters are the same, bit for bit, as with
``overlap=False``.

Thread-safety: the hooks run on autograd's threads, the rest on the training loop's thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Set

import torch
from torch import nn

from optstep.client import StepReply
from optstep.streamed_step import StreamedStep

if TYPE_CHECKING:
    from optstep.torch.remote_optimizer import RemoteOptimizer

__all__ = ["BackwardOverlap"]


def make_buckets(tensors: List[torch.Tensor], bucket_bytes: int) -> List[List[int]]:
    """Parameter indices in buckets of at most `bucket_bytes` (one parameter at least), in
    reverse order."""
    buckets: List[List[int]] = []
    size = 0
    for i in reversed(range(len(tensors))):
        nbytes = tensors[i].numel() * tensors[i].element_size()
        if not buckets or (size + nbytes > bucket_bytes and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


class BackwardOverlap:
    """The hooks and the in-flight step of one RemoteOptimizer with ``overlap=True``."""

    def __init__(self, optimizer: "RemoteOptimizer", tensors: List[torch.Tensor],
                 module: Optional[nn.Module], bucket_bytes: int) -> None:
        self._opt = optimizer
        self._buckets = make_buckets(tensors, bucket_bytes)
        self._bucket_of = {i: b for b, ids in enumerate(self._buckets) for i in ids}
        self._lock = threading.Lock()
        self._syncing = True
        self._step: Optional[StreamedStep] = None  # open while its gradients are added
        self._missing: List[Set[int]] = [set(ids) for ids in self._buckets]
        self._sent: Set[int] = set()
        # The step being resolved in the background, and how it ended.
        self._resolving: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.background = module is not None
        # Set once parameter i holds the values of the step resolving in the background.
        self._in_model = [threading.Event() for _ in tensors]
        for event in self._in_model:
            event.set()
        self._handles = [t.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
            functools.partial(self._accumulated, i)) for i, t in enumerate(tensors)]
        if module is not None:
            index = {id(t): i for i, t in enumerate(tensors)}
            for sub in module.modules():
                own = [index[id(p)] for p in sub.parameters(recurse=False) if id(p) in index]
                if own:
                    self._handles.append(sub.register_forward_pre_hook(
                        functools.partial(self._before_forward, own)))

    @property
    def bucket_count(self) -> int:
        return len(self._buckets)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally and send nothing."""
        previous, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = previous

    def _accumulated(self, i: int, tensor: torch.Tensor) -> None:
        if not self._syncing:
            return
        self.wait()
        with self._lock:
            if i in self._sent:
                raise RuntimeError(
                    f"param '{self._opt.parameter_names[i]}' got a second gradient after it was "
                    f"sent for step {self._opt.next_step}: run the micro-batches that do not "
                    "step under opt.no_sync()")
            if self._step is None:
                self._step = self._opt._open_step()
            missing = self._missing[self._bucket_of[i]]
            missing.discard(i)
            if missing:
                return
            bucket = self._buckets[self._bucket_of[i]]
            self._sent.update(bucket)
            step = self._step
        step.add(self._opt._gradient_slices(bucket))

    def discard(self) -> None:
        """Closes the step opened by a backward pass that did not reach step() (it raised part
        way, or the gradients were zeroed): nothing of it is applied, and the next backward
        opens the step afresh."""
        with self._lock:
            step, self._step = self._step, None
            self._sent = set()
            self._missing = [set(ids) for ids in self._buckets]
        if step is not None:
            step.close()

    def finish(self) -> Optional[StepReply]:
        """Commits the step: in the background (answers None) for a module, else at once."""
        self.wait()
        with self._lock:
            step, self._step = self._step, None
            rest = [i for i in range(len(self._bucket_of)) if i not in self._sent]
            self._sent = set()
            self._missing = [set(ids) for ids in self._buckets]
        if step is None:
            step = self._opt._open_step()
        try:
            step.add(self._opt._gradient_slices(rest))
        except BaseException:
            step.close()
            raise
        self._opt._advance()
        if not self.background:
            try:
                return self._opt._resolve(step)
            except BaseException as e:
                self._opt._failed(e)  # the step's number back (redo it), or the rewind
        for event in self._in_model:
            event.clear()
        self._resolving = threading.Thread(target=self._resolve, args=(step,),
                                           name="optstep-overlap", daemon=True)
        self._resolving.start()
        return None

    def _resolve(self, step: StreamedStep) -> None:
        try:
            self._opt._resolve(step, lambda i: self._in_model[i].set())
        except BaseException as e:  # raised by wait()
            self._error = e
        finally:
            for event in self._in_model:
                event.set()

    def wait(self) -> None:
        """Waits for the step resolving in the background; raises its error."""
        thread = self._resolving
        if thread is None:
            return
        thread.join()
        with self._lock:  # autograd's threads and the forward hooks may wait at once
            if self._resolving is not thread:
                return  # another caller took its end (and raises its error)
            self._resolving = None
            error, self._error = self._error, None
        if error is not None:
            self._opt._failed(error)

    def _before_forward(self, own: List[int], module: nn.Module, inputs: Any) -> None:
        """The module runs once its own parameters are in: the rest of the step may still be
        arriving. The step's error, if any, is raised by the first module after its end."""
        for i in own:
            self._in_model[i].wait()
        thread = self._resolving
        # _error is set before the parameters' events, so a failed step is seen here even while
        # its thread is still ending.
        if thread is not None and (self._error is not None or not thread.is_alive()):
            self.wait()

    def remove(self) -> None:
        """Removes the hooks, after waiting for a step in flight (whose error is raised once they
        are off), and closes the step a backward opened that did not reach step()."""
        try:
            self.wait()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            # A backward that did not reach step() holds its step open (on the native data path,
            # the C++ client too, which Client.close() could then not free).
            self.discard()

