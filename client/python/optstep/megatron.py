"""optstep.megatron: a megatron-core optimizer state to an optstep session's state dict and back.

A megatron-core ``ChainedOptimizer`` (Muon for the linear layers, Adam for the rest, ...) holds
one sub-optimizer per chain link. Its state comes in two forms, both understood here:

- flat, as megatron-core's distributed checkpoints name it: ``"chained_<i>.optimizer.state.
  <key>.<param name>"`` tensors (``<key>``: ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``,
  ``fp32_param``, ...), ``"common_step"`` (the step count), and optionally
  ``"chained_<i>.optimizer.param_groups"`` (a single optimizer has no ``chained_<i>.`` prefix);
- in memory, ``ChainedOptimizer.state_dict()``: a list with one dict per sub-optimizer, each
  ``{"optimizer": {"state": {index: {key: tensor, "step": ...}}, "param_groups": [...]}}``,
  whose indices count that sub-optimizer's parameters in order (``param_names[i]``).

The session's keys are found by parameter name (docs/design.md §5): ``state/<sub-optimizer>/
<name>/<key>`` for the sub-optimizer the session routed the parameter to, ``param/<name>`` for the
fp32 masters (``fp32_param``; else the model's current values), the step counters from
``common_step``. Group hyperparameters map by the groups' parameters: Megatron's ``lr`` is the
group's lr; its ``weight_decay`` is the effective decay ``wd · wd_mult`` (what Megatron's
scheduler writes), optstep's group ``weight_decay`` the one before ``wd_mult`` (spec §1.3); a
``wd_mult`` that disagrees with the session's is refused (it decides which parameters decay).
``lr_mult`` is Megatron's own (the scheduler's factor) and is kept on the way back.

    state = optstep.megatron.to_optstep(megatron_state, remote, param_names=names)
    remote.load_state_dict(state)                         # a RemoteOptimizer continues the run
    back = optstep.megatron.from_optstep(remote.state_dict(), names)   # flat, or flat=False
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["to_optstep", "from_optstep"]

_FLAT_KEY = re.compile(r"^(?:chained_(\d+)\.)?optimizer\.state\.([A-Za-z0-9_]+)\.(.+)$")
_FLAT_GROUPS = re.compile(r"^(?:chained_(\d+)\.)?optimizer\.param_groups$")
_MASTER = "fp32_param"
_COUNTERS = ("step",)


class _Megatron:
    """A megatron-core chained state, normalised: per parameter name its tensors, the step, and
    each sub-optimizer's param groups with parameter names."""

    def __init__(self) -> None:
        self.tensors: Dict[str, Dict[str, Any]] = {}
        self.step: Optional[int] = None
        self.groups: List[Dict[str, Any]] = []  # each with "param_names"


def _step_of(value: Any) -> int:
    return int(value.item() if hasattr(value, "item") else value)


def _read_flat(state: Mapping[str, Any]) -> _Megatron:
    parsed = _Megatron()
    for key, value in state.items():
        tensor_key = _FLAT_KEY.match(key)
        if tensor_key:
            parsed.tensors.setdefault(tensor_key.group(3), {})[tensor_key.group(2)] = value
        elif key == "common_step":
            parsed.step = _step_of(value)
        elif _FLAT_GROUPS.match(key):
            for group in value:
                if all(isinstance(p, str) for p in group.get("params", [])):
                    parsed.groups.append(dict(group, param_names=list(group["params"])))
        else:
            raise ValueError(f"megatron state key '{key}' is neither "
                             "'chained_<i>.optimizer.state.<key>.<param>', "
                             "'chained_<i>.optimizer.param_groups' nor 'common_step'")
    return parsed


def _read_list(state: Sequence[Mapping[str, Any]],
               param_names: Sequence[Sequence[str]]) -> _Megatron:
    if len(param_names) != len(state):
        raise ValueError(f"megatron state has {len(state)} sub-optimizers, param_names "
                         f"{len(param_names)}")
    parsed = _Megatron()
    for i, (sub, names) in enumerate(zip(state, param_names)):
        inner = sub.get("optimizer", sub)
        for index, per_param in inner.get("state", {}).items():
            if not 0 <= int(index) < len(names):
                raise ValueError(f"sub-optimizer {i}: state of parameter index {index}, but "
                                 f"param_names[{i}] names {len(names)} parameters")
            tensors = parsed.tensors.setdefault(names[int(index)], {})
            for key, value in per_param.items():
                if key in _COUNTERS:
                    parsed.step = _step_of(value)
                else:
                    tensors[key] = value
        for group in inner.get("param_groups", []):
            if "step" in group and parsed.step is None:
                parsed.step = _step_of(group["step"])
            parsed.groups.append(dict(group, param_names=[names[int(p)]
                                                          for p in group.get("params", [])]))
    return parsed


def to_optstep(megatron_state: Any, optimizer: Any,
               param_names: Optional[Sequence[Sequence[str]]] = None) -> Dict[str, Any]:
    """A :class:`optstep.torch.RemoteOptimizer` state dict (for its ``load_state_dict``) of a
    megatron-core chained state, flat or the in-memory list (which needs `param_names`: each
    sub-optimizer's parameter names in order). ValueError names a parameter the session lacks
    or a disagreeing ``wd_mult``; the server refuses state its sub-optimizers do not hold."""
    if isinstance(megatron_state, Mapping):
        parsed = _read_flat(megatron_state)
    else:
        if param_names is None:
            raise ValueError("the in-memory megatron state (a list) needs param_names")
        parsed = _read_list(megatron_state, param_names)
    if parsed.step is None:
        raise ValueError("megatron state without a step count ('common_step' or 'step')")
    sub_of = {name: group["sub_optimizer"] for group in optimizer.param_groups
              for name in group["param_names"]}
    model = {name: tensor for group in optimizer.param_groups
             for name, tensor in zip(group["param_names"], group["params"])}
    state: Dict[str, Any] = {}
    for name, tensors in parsed.tensors.items():
        if name not in sub_of:
            raise ValueError(f"megatron parameter '{name}' is not a parameter of session "
                             f"'{optimizer.session_id}'")
        for key, value in tensors.items():
            if key == _MASTER:
                state[f"param/{name}"] = value
            else:
                state[f"state/{sub_of[name]}/{name}/{key}"] = value
    for name, tensor in model.items():
        state.setdefault(f"param/{name}", tensor.detach().float().cpu())
    for group in optimizer.param_groups:
        state[f"state/{group['sub_optimizer']}/group{group['group_id']}/step"] = parsed.step
    state["meta/step"] = parsed.step
    state["meta/skipped_steps"] = 0
    return {"state": _as_tensors(state), "param_groups": _groups_to_optstep(optimizer, parsed),
            "step": parsed.step}


def _as_tensors(state: Mapping[str, Any]) -> Dict[str, Any]:
    import torch

    out: Dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, int):
            out[key] = torch.tensor(value, dtype=torch.int64)
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().cpu()
        else:
            out[key] = torch.as_tensor(value)
    return out


def _groups_to_optstep(optimizer: Any, parsed: _Megatron) -> List[Dict[str, Any]]:
    by_name = {name: group for group in parsed.groups for name in group["param_names"]}
    groups = []
    for group in optimizer.param_groups:
        saved = {k: v for k, v in group.items() if k != "params"}
        saved["params"] = [optimizer.parameter_names.index(n) for n in group["param_names"]]
        megatron = next((by_name[n] for n in group["param_names"] if n in by_name), None)
        if megatron is not None:
            wd_mult = float(megatron.get("wd_mult", group["wd_mult"]))
            if wd_mult != group["wd_mult"]:
                raise ValueError(f"group {group['group_id']} ({group['sub_optimizer']}): megatron "
                                 f"wd_mult {wd_mult}, the session's {group['wd_mult']}")
            saved["lr"] = float(megatron["lr"])
            if wd_mult > 0:
                saved["weight_decay"] = float(megatron["weight_decay"]) / wd_mult
        groups.append(saved)
    return groups


def from_optstep(state_dict: Mapping[str, Any], param_names: Sequence[Sequence[str]],
                 flat: bool = True,
                 groups: Optional[Sequence[Sequence[Mapping[str, Any]]]] = None) -> Any:
    """The megatron-core chained state of a :class:`RemoteOptimizer` state dict: flat
    (``chained_<i>.optimizer.state.<key>.<param>``, ``common_step``,
    ``chained_<i>.optimizer.param_groups``) or, with ``flat=False``, the in-memory list.
    `param_names` are each Megatron sub-optimizer's parameter names, in order; `groups` (each
    sub-optimizer's Megatron param groups) keep their other keys (``lr_mult``, ...) and get the
    session's lr and effective weight decay."""
    state = state_dict["state"]
    step = int(state_dict["step"])
    per_param: Dict[str, Dict[str, Any]] = {}
    for key, value in state.items():
        parts = key.split("/")
        if parts[0] == "param":
            per_param.setdefault("/".join(parts[1:]), {})[_MASTER] = value
        elif parts[0] == "state" and len(parts) >= 4:
            per_param.setdefault("/".join(parts[2:-1]), {})[parts[-1]] = value
    optstep_groups = {name: g for g in state_dict["param_groups"]
                      for name in g.get("param_names", [])}
    out_flat: Dict[str, Any] = {"common_step": step}
    out_list: List[Dict[str, Any]] = []
    for i, names in enumerate(param_names):
        prefix = f"chained_{i}."
        missing = [n for n in names if n not in per_param]
        if missing:
            raise ValueError(f"sub-optimizer {i}: the state dict has no parameter {missing[:3]}")
        sub_state: Dict[int, Dict[str, Any]] = {}
        for index, name in enumerate(names):
            for key, value in per_param[name].items():
                out_flat[f"{prefix}optimizer.state.{key}.{name}"] = value
            sub_state[index] = dict(per_param[name], step=step)
        sub_groups = _groups_to_megatron(names, optstep_groups,
                                         groups[i] if groups is not None else None)
        out_flat[f"{prefix}optimizer.param_groups"] = [
            dict(g, params=[names[p] for p in g["params"]]) for g in sub_groups]
        out_list.append({"optimizer": {"state": sub_state, "param_groups": sub_groups}})
    return out_flat if flat else out_list


def _groups_to_megatron(names: Sequence[str], optstep_groups: Mapping[str, Mapping[str, Any]],
                        template: Optional[Sequence[Mapping[str, Any]]]) -> List[Dict[str, Any]]:
    """One Megatron group per optstep group among `names` (or the template's groups, updated)."""
    keyed: Dict[Tuple[int, ...], List[int]] = {}
    for index, name in enumerate(names):
        group = optstep_groups.get(name)
        keyed.setdefault((int(group["group_id"]),) if group else (-1,), []).append(index)
    made: List[Dict[str, Any]] = []
    for (group_id,), indices in keyed.items():
        source = optstep_groups.get(names[indices[0]], {})
        wd_mult = float(source.get("wd_mult", 1.0))
        made.append({"params": indices, "lr": float(source.get("lr", 0.0)),
                     "weight_decay": float(source.get("weight_decay", 0.0)) * wd_mult,
                     "wd_mult": wd_mult, "lr_mult": 1.0, "optstep_group_id": group_id})
    if template is None:
        return made
    updated = []
    for group in template:
        match = next((m for m in made if set(m["params"]) & set(group.get("params", []))), None)
        merged = dict(group)
        if match is not None:
            merged.update(lr=match["lr"], weight_decay=match["weight_decay"])
        updated.append(merged)
    return updated
