"""The values optstep.Client takes and answers (re-exported by optstep.client and optstep)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Mapping, NamedTuple, Optional, Union

import numpy as np

from optstep.chunks import GradientSlice
from optstep.v1 import session_pb2

__all__ = ["CreatedSession", "GroupSchedule", "StepReply", "Parameters", "Gradients"]

#: A step's gradients: whole tensors by parameter id or name, or slices (any ranges).
Gradients = Union[Mapping[int, Any], Mapping[str, Any], Iterable[GradientSlice]]


class CreatedSession(NamedTuple):
    info: session_pb2.SessionInfo
    # True when the session of the same name and definition answered (another trainer made it);
    # False for a session this call made, also when a retry of it found the session.
    attached: bool


@dataclasses.dataclass
class GroupSchedule:
    """This step's schedule values for one hyperparameter group (SessionInfo.groups[].id)."""

    group_id: int
    lr: Optional[float] = None
    weight_decay: Optional[float] = None


@dataclasses.dataclass
class StepReply:
    step: int            # the step just applied (or skipped)
    skipped: bool        # non-finite gradients: nothing changed
    grad_norm: float     # pre-clip global L2 norm; 0 when skipped
    clipped: bool
    #: Updated parameters by id, shaped: float32 arrays, or uint16 bf16 bits for bf16. Empty
    #: with skip_return (and for a skipped step the server sends none).
    params: Dict[int, np.ndarray]


@dataclasses.dataclass
class Parameters:
    step: int  # the step the values belong to
    params: Dict[int, np.ndarray]
