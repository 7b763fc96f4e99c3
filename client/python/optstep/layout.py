"""What the client knows about a session to route and check tensors: each parameter's name,
shape, element count and owner rank. Built from a SessionInfo, then immutable (shareable
between threads). Mirrors client/cpp/session_layout.h.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Iterable, List, Sequence, Tuple, Union

from optstep.errors import InternalError, InvalidArgumentError, NotFoundError
from optstep.v1 import session_pb2

__all__ = ["ParamLayout", "SessionLayout", "ParamRef"]

#: A parameter named by its id (index in the session's parameter list) or by its name.
ParamRef = Union[int, str]


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """One parameter of a session."""

    param_id: int
    name: str
    shape: Tuple[int, ...]
    numel: int
    owner: int  # rank that owns the parameter's optimizer state


@dataclasses.dataclass(frozen=True)
class SessionLayout:
    """The parameters of a session and the ranks that own them.

    ``rank_targets`` are the addresses the ranks advertise (empty when the server does not say).
    ``stood_in_ranks``: the ranks whose own process was lost for good and that a stand-in in
    another rank's process serves meanwhile, at its ``rank_targets`` entry.
    ``owners_only``: OWNERS parameter storage, where each rank holds (and returns) only the
    parameters it owns.
    """

    session_id: str
    world_size: int
    params: Tuple[ParamLayout, ...]
    rank_targets: Tuple[str, ...] = ()
    owners_only: bool = False
    stood_in_ranks: Tuple[int, ...] = ()
    _ids: Dict[str, int] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def from_session_info(info: session_pb2.SessionInfo) -> "SessionLayout":
        """INTERNAL when `info` (which comes from the server) is inconsistent."""
        sid = info.session_id
        owners = list(info.layout.owner)
        world = info.layout.world_size
        if world == 0 and not owners:
            world = 1
        if world == 0:
            raise InternalError(f"session '{sid}': layout has world_size 0 but {len(owners)} owners")
        specs = info.spec.parameters
        if owners and len(owners) != len(specs):
            raise InternalError(
                f"session '{sid}': layout has {len(owners)} owners for {len(specs)} parameters")
        params: List[ParamLayout] = []
        for i, spec in enumerate(specs):
            shape = tuple(int(d) for d in spec.shape)
            if any(d == 0 for d in shape):
                raise InternalError(f"session '{sid}': param '{spec.name}' has a zero dimension")
            owner = owners[i] if owners else 0
            if owner >= world:
                raise InternalError(f"session '{sid}': param '{spec.name}' is owned by rank "
                                    f"{owner} of world size {world}")
            params.append(ParamLayout(i, spec.name, shape, math.prod(shape), owner))
        targets = tuple(getattr(info.layout, "rank_targets", ()))
        ids = {p.name: p.param_id for p in params}
        owners_only = info.spec.parameter_storage == session_pb2.PARAMETER_STORAGE_OWNERS
        stood_in = tuple(int(r) for r in getattr(info.layout, "stood_in_ranks", ()))
        return SessionLayout(sid, world, tuple(params), targets, owners_only, stood_in, ids)

    @property
    def num_params(self) -> int:
        return len(self.params)

    def owners_of(self, param_ids: Sequence[int]) -> List[int]:
        """The ranks that own any of `param_ids` (empty: every parameter), ascending."""
        ids = param_ids or range(len(self.params))
        return sorted({self.params[i].owner for i in ids})

    def param(self, ref: ParamRef) -> ParamLayout:
        """The parameter with id or name `ref`; NotFoundError naming the session otherwise."""
        if isinstance(ref, str):
            pid = self._ids.get(ref)
            if pid is None:
                raise NotFoundError(f"param '{ref}' not found in session '{self.session_id}'")
            return self.params[pid]
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise InvalidArgumentError(f"parameter reference {ref!r} is neither an id nor a name")
        if not 0 <= ref < len(self.params):
            raise NotFoundError(f"param_id {ref} not found: session '{self.session_id}' has "
                                f"{len(self.params)} parameters")
        return self.params[ref]

    def param_ids(self, refs: Iterable[ParamRef]) -> List[int]:
        """Ids of `refs`, checked; InvalidArgumentError for a parameter named twice."""
        ids: List[int] = []
        seen = set()
        for ref in refs:
            pid = self.param(ref).param_id
            if pid in seen:
                raise InvalidArgumentError(f"param '{self.params[pid].name}' is listed twice")
            seen.add(pid)
            ids.append(pid)
        return ids
