"""Builders for the optimizer part of a session (``optstep.v1.OptimizerConfig``).

A session's optimizer is either a Megatron preset (spec Appendix A) or a chain of named
sub-optimizers with routing rules (spec §4). Unset arguments (None) leave the proto field unset,
so the server applies the spec's defaults::

    from optstep import config
    # Muon for the 2-D hidden matrices, AdamW for the rest (embeddings, output layer, 1-D):
    opt = config.chain(config.muon(lr=0.02, momentum=0.95), config.adamw(lr=3e-3))
    # The Megatron default of --optimizer muon:
    opt = config.preset("muon", lr=0.02)
    # A rule with group overrides (tried before the default routing):
    opt = config.chain(config.muon(lr=0.02), config.adamw(lr=3e-3),
                       rules=[config.rule("adamw", name_glob="*.norm.weight", lr=1e-3)])
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from optstep.v1 import optimizer_config_pb2 as pb

__all__ = [
    "adamw", "sgd", "lion", "muon", "adaptive_muon", "soap", "rule", "chain", "preset",
    "muon_chain", "soap_chain",
]

_WD_MODES: Dict[Optional[str], pb.WeightDecayMode] = {
    None: pb.WEIGHT_DECAY_MODE_UNSPECIFIED,
    "decoupled": pb.WEIGHT_DECAY_MODE_DECOUPLED,
    "independent": pb.WEIGHT_DECAY_MODE_INDEPENDENT,
    "l2": pb.WEIGHT_DECAY_MODE_L2,
    "palm": pb.WEIGHT_DECAY_MODE_PALM,
}


def _betas(betas: Optional[Tuple[float, float]]) -> Tuple[Optional[float], Optional[float]]:
    return (None, None) if betas is None else (betas[0], betas[1])


def _wd_mode(mode: Optional[str]) -> pb.WeightDecayMode:
    if mode not in _WD_MODES:
        raise ValueError(f"weight_decay_mode {mode!r} is not one of "
                         f"{sorted(k for k in _WD_MODES if k)}")
    return _WD_MODES[mode]


def adamw(lr: Optional[float] = None, betas: Optional[Tuple[float, float]] = None,
          eps: Optional[float] = None, weight_decay: Optional[float] = None,
          decoupled: Optional[bool] = None, bias_correction: Optional[bool] = None,
          name: str = "adamw") -> pb.SubOptimizer:
    """Adam / AdamW (spec §3.1); `decoupled=False` is L2 Adam."""
    beta1, beta2 = _betas(betas)
    return pb.SubOptimizer(name=name, kind="adamw", adamw=pb.AdamWOptions(
        lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
        decoupled=decoupled, bias_correction=bias_correction))


def sgd(lr: Optional[float] = None, momentum: Optional[float] = None,
        weight_decay: Optional[float] = None, nesterov: Optional[bool] = None,
        name: str = "sgd") -> pb.SubOptimizer:
    """SGD with momentum and coupled (L2) weight decay (spec §3.2)."""
    return pb.SubOptimizer(name=name, kind="sgd", sgd=pb.SgdOptions(
        lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))


def lion(lr: Optional[float] = None, betas: Optional[Tuple[float, float]] = None,
         weight_decay: Optional[float] = None, weight_decay_mode: Optional[str] = None,
         name: str = "lion") -> pb.SubOptimizer:
    """Lion (spec §3.3)."""
    beta1, beta2 = _betas(betas)
    return pb.SubOptimizer(name=name, kind="lion", lion=pb.LionOptions(
        lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
        weight_decay_mode=_wd_mode(weight_decay_mode)))


def _muon_options(lr: Optional[float], momentum: Optional[float], nesterov: Optional[bool],
                  weight_decay: Optional[float], weight_decay_mode: Optional[str],
                  coefficient_type: str, custom_coefficients: Sequence[float],
                  num_ns_steps: Optional[int], scale_mode: str,
                  extra_scale_factor: Optional[float], fp32_matmul_prec: str,
                  split_qkv: Optional[bool], ns_eps: Optional[float]) -> pb.MuonOptions:
    return pb.MuonOptions(
        lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
        weight_decay_mode=_wd_mode(weight_decay_mode), coefficient_type=coefficient_type,
        custom_coefficients=list(custom_coefficients), num_ns_steps=num_ns_steps,
        scale_mode=scale_mode, extra_scale_factor=extra_scale_factor,
        fp32_matmul_prec=fp32_matmul_prec, split_qkv=split_qkv, ns_eps=ns_eps)


def muon(lr: Optional[float] = None, momentum: Optional[float] = None,
         nesterov: Optional[bool] = None, weight_decay: Optional[float] = None,
         weight_decay_mode: Optional[str] = None, coefficient_type: str = "",
         custom_coefficients: Sequence[float] = (), num_ns_steps: Optional[int] = None,
         scale_mode: str = "", extra_scale_factor: Optional[float] = None,
         fp32_matmul_prec: str = "", split_qkv: Optional[bool] = None,
         ns_eps: Optional[float] = None, name: str = "muon") -> pb.SubOptimizer:
    """Muon (spec §3.4): momentum, Newton–Schulz orthogonalization, scale.

    coefficient_type: "simple", "quintic" (default), "polar_express", "aol", "custom";
    scale_mode: "spectral" (default), "shape_scaling", "unit_rms_norm";
    fp32_matmul_prec: "highest", "high", "medium" (default). Empty strings mean the default.
    """
    return pb.SubOptimizer(name=name, kind="muon", muon=_muon_options(
        lr, momentum, nesterov, weight_decay, weight_decay_mode, coefficient_type,
        custom_coefficients, num_ns_steps, scale_mode, extra_scale_factor, fp32_matmul_prec,
        split_qkv, ns_eps))


def adaptive_muon(lr: Optional[float] = None, moment2_method: str = "",
                  beta2: Optional[float] = None, eps: Optional[float] = None,
                  name: str = "adaptive_muon", **muon_args: Any) -> pb.SubOptimizer:
    """AdaptiveMuon (spec §3.5): Muon (any :func:`muon` argument) plus a second moment,
    `moment2_method` "adamuon" (default) or "normuon"."""
    inner = muon(lr=lr, **muon_args).muon
    return pb.SubOptimizer(name=name, kind="adaptive_muon", adaptive_muon=pb.AdaptiveMuonOptions(
        muon=inner, moment2_method=moment2_method, beta2=beta2, eps=eps))


def soap(lr: Optional[float] = None, betas: Optional[Tuple[float, float]] = None,
         shampoo_beta: Optional[float] = None, eps: Optional[float] = None,
         weight_decay: Optional[float] = None, weight_decay_mode: Optional[str] = None,
         precondition_frequency: Optional[int] = None,
         precondition_warmup_steps: Optional[int] = None,
         use_kl_shampoo: Optional[bool] = None, bias_correction: Optional[bool] = None,
         use_eigh_after_first: Optional[bool] = None, max_update_rms: Optional[float] = None,
         fp32_matmul_prec: str = "", qr_fp32_matmul_prec: str = "",
         name: str = "soap") -> pb.SubOptimizer:
    """SOAP: Adam in the Shampoo eigenbasis (spec §3.6)."""
    beta1, beta2 = _betas(betas)
    return pb.SubOptimizer(name=name, kind="soap", soap=pb.SoapOptions(
        lr=lr, beta1=beta1, beta2=beta2, shampoo_beta=shampoo_beta, eps=eps,
        weight_decay=weight_decay, weight_decay_mode=_wd_mode(weight_decay_mode),
        precondition_frequency=precondition_frequency,
        precondition_warmup_steps=precondition_warmup_steps, use_kl_shampoo=use_kl_shampoo,
        bias_correction=bias_correction, use_eigh_after_first=use_eigh_after_first,
        max_update_rms=max_update_rms, fp32_matmul_prec=fp32_matmul_prec,
        qr_fp32_matmul_prec=qr_fp32_matmul_prec))


def rule(sub_optimizer: str, *, name_glob: str = "", ndim: Optional[int] = None,
         embedding_or_output: Optional[bool] = None, lr: Optional[float] = None,
         weight_decay: Optional[float] = None, wd_mult: Optional[float] = None,
         beta1: Optional[float] = None, beta2: Optional[float] = None,
         eps: Optional[float] = None, momentum: Optional[float] = None) -> pb.RoutingRule:
    """Routes the parameters matching every given condition to `sub_optimizer` (by name), in a
    group with the given overrides. `name_glob` is fnmatch-style ("*" matches dots too)."""
    return pb.RoutingRule(
        name_glob=name_glob, ndim=ndim, embedding_or_output=embedding_or_output,
        sub_optimizer=sub_optimizer, overrides=pb.GroupOverrides(
            lr=lr, weight_decay=weight_decay, wd_mult=wd_mult, beta1=beta1, beta2=beta2,
            eps=eps, momentum=momentum))


def chain(*sub_optimizers: pb.SubOptimizer, rules: Iterable[pb.RoutingRule] = (),
          clip_grad: Optional[float] = None,
          mup_width_mult: Optional[float] = None) -> pb.OptimizerConfig:
    """A chain of sub-optimizers. Parameters no rule matches follow the spec §4 routing when the
    chain has an AdamW and a matrix optimizer (2-D, not embedding/output → the matrix one; the
    rest → AdamW), or go to the only sub-optimizer. `clip_grad` unset: the service's default of
    1.0, except under :class:`optstep.torch.RemoteOptimizer`, which clips nothing unless asked
    (torch semantics); <= 0 disables.
    """
    return pb.OptimizerConfig(sub_optimizers=list(sub_optimizers), rules=list(rules),
                              clip_grad=clip_grad, mup_width_mult=mup_width_mult)


def preset(name: str, clip_grad: Optional[float] = None,
           **megatron_args: Any) -> pb.OptimizerConfig:
    """A Megatron preset ("adam", "sgd", "muon", "adaptive_muon", "soap", "lion") with Megatron
    argument overrides, e.g. ``preset("muon", lr=0.02, muon_momentum=0.95)``.

    The presets are Megatron-LM's command-line defaults (spec Appendix A), which differ from
    megatron-core's ``OptimizerConfig`` defaults: Muon's momentum is 0.9 here, 0.95 there (pass
    ``muon_momentum=0.95`` to match megatron-core). Global clipping is Megatron's 1.0."""
    args = {key: repr(value) if isinstance(value, float) else str(value)
            for key, value in megatron_args.items()}
    if clip_grad is not None:
        args["clip_grad"] = repr(float(clip_grad))
    return pb.OptimizerConfig(preset=name, megatron_args=args)


def muon_chain(lr: float = 0.02, adam_lr: float = 3e-3, weight_decay: float = 0.01,
               momentum: float = 0.95, clip_grad: Optional[float] = None,
               rules: Iterable[pb.RoutingRule] = (), **muon_args: Any) -> pb.OptimizerConfig:
    """Muon for the hidden matrices, AdamW for everything else (spec §4 routing)."""
    return chain(muon(lr=lr, momentum=momentum, weight_decay=weight_decay, **muon_args),
                 adamw(lr=adam_lr, weight_decay=weight_decay), rules=rules, clip_grad=clip_grad)


def soap_chain(lr: float = 3e-3, adam_lr: float = 3e-3, weight_decay: float = 0.01,
               clip_grad: Optional[float] = None, rules: Iterable[pb.RoutingRule] = (),
               **soap_args: Any) -> pb.OptimizerConfig:
    """SOAP for the hidden matrices, AdamW for everything else (spec §4 routing)."""
    return chain(soap(lr=lr, weight_decay=weight_decay, **soap_args),
                 adamw(lr=adam_lr, weight_decay=weight_decay), rules=rules, clip_grad=clip_grad)
