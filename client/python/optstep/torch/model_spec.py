"""From a torch module's named parameters to the session's ParameterSpecs (spec §4 routing).

The server routes each parameter by its declaration: 2-D and not flagged embedding/output → the
chain's matrix optimizer (Muon, SOAP, ...); flagged, 1-D and other ranks → AdamW; ``*.bias`` and
1-D get no weight decay. This module fills in those flags from the module:

- embedding: the weights of ``nn.Embedding`` / ``nn.EmbeddingBag``;
- output layer: the weight of the last ``nn.Linear`` in module order (``detect_output``), which
  is the classifier / LM head of the usual models (a weight tied to an embedding is one
  parameter and keeps its first name);
- QKV split: ``nn.MultiheadAttention.in_proj_weight`` is ``[Q; K; V]`` stacked, i.e. one query
  group of ``embed_dim`` rows each: ``QkvSplit(num_query_groups=1, q_per_group=1,
  head_dim=embed_dim)``. Other fused projections have model-specific layouts: give them with
  `qkv`.

Every detection can be overridden by name or fnmatch glob (first matching key wins).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from optstep.v1 import session_pb2

__all__ = ["ParamDescription", "QkvLike", "describe_parameters"]

#: A QKV split: a QkvSplit message or (num_query_groups, q_per_group, head_dim).
QkvLike = Union[session_pb2.QkvSplit, Tuple[int, int, int]]
NamedParams = Iterable[Tuple[str, torch.Tensor]]


@dataclasses.dataclass
class ParamDescription:
    """One parameter: its name, the tensor it lives in and its declaration."""

    name: str
    tensor: torch.Tensor
    spec: session_pb2.ParameterSpec


def _lookup(table: Optional[Mapping[str, Any]], name: str) -> Any:
    """The value of the first key of `table` that equals or globs `name`."""
    if not table:
        return None
    if name in table:
        return table[name]
    for pattern, value in table.items():
        if fnmatch.fnmatchcase(name, pattern):
            return value
    return None


def _as_table(value: Union[None, Iterable[str], Mapping[str, object]],
              fill: object) -> Dict[str, object]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    return {name: fill for name in value}


def _as_qkv(value: QkvLike) -> session_pb2.QkvSplit:
    if isinstance(value, session_pb2.QkvSplit):
        return value
    groups, q_per_group, head_dim = value
    return session_pb2.QkvSplit(num_query_groups=groups, q_per_group=q_per_group,
                                head_dim=head_dim)


def _detect(module: nn.Module, detect_output: bool) -> Tuple[Dict[int, bool], Dict[int, QkvLike]]:
    """Flags by tensor identity: embedding/output weights and MultiheadAttention QKV splits."""
    flagged: Dict[int, bool] = {}
    qkv: Dict[int, QkvLike] = {}
    last_linear: Optional[nn.Linear] = None
    for sub in module.modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)):
            flagged[id(sub.weight)] = True
        elif isinstance(sub, nn.Linear) and sub.weight.requires_grad:
            last_linear = sub
        elif isinstance(sub, nn.MultiheadAttention) and sub.in_proj_weight is not None:
            qkv[id(sub.in_proj_weight)] = (1, 1, sub.embed_dim)
    if detect_output and last_linear is not None:
        flagged[id(last_linear.weight)] = True
    return flagged, qkv


def describe_parameters(
        params: Union[nn.Module, NamedParams], *,
        embedding_or_output: Union[None, Iterable[str], Mapping[str, bool]] = None,
        detect_output: bool = True,
        qkv: Optional[Mapping[str, QkvLike]] = None,
        model_chunk: Union[int, Mapping[str, int]] = 0,
        expert: Iterable[str] = ()) -> List[ParamDescription]:
    """Declares the trainable parameters of `params` (a module, or (name, tensor) pairs).

    Args:
      embedding_or_output: names/globs to flag (an iterable), or name/glob → flag (a mapping,
        which can also unflag a detected one).
      detect_output: flag the last nn.Linear's weight as the output layer (module only).
      qkv: name/glob → QKV split for fused attention projections.
      model_chunk: the model chunk of every parameter, or name/glob → chunk (default 0).
      expert: names/globs of expert-parallel parameters.
    Parameters that do not require a gradient are left out.
    """
    named: List[Tuple[str, torch.Tensor]]
    if isinstance(params, nn.Module):
        flagged, detected_qkv = _detect(params, detect_output)
        named = list(params.named_parameters())
    else:
        flagged, detected_qkv = {}, {}
        named = list(params)
    flags = _as_table(embedding_or_output, True)
    qkv_table = dict(qkv or {})
    chunks = model_chunk if isinstance(model_chunk, Mapping) else {}
    default_chunk = 0 if isinstance(model_chunk, Mapping) else model_chunk
    experts = _as_table(expert, True)
    described = []
    seen = set()
    for name, tensor in named:
        if not tensor.requires_grad or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        flag = _lookup(flags, name)
        split = _lookup(qkv_table, name)
        if split is None:
            split = detected_qkv.get(id(tensor))
        chunk = _lookup(chunks, name)
        spec = session_pb2.ParameterSpec(
            name=name, shape=list(tensor.shape),
            model_chunk=int(default_chunk if chunk is None else chunk),
            embedding_or_output=bool(flagged.get(id(tensor), False) if flag is None else flag),
            expert=bool(_lookup(experts, name)))
        if split is not None:
            spec.qkv.CopyFrom(_as_qkv(split))
        described.append(ParamDescription(name, tensor, spec))
    return described
