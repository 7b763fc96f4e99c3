"""optstep.megatron: a megatron-core chained optimizer state (flat, as its distributed checkpoints
name it, and the in-memory list) onto an optstep session and back.

The Megatron state is built here in megatron-core's layout from a torch AdamW run (megatron-core's
Adam keeps the same exp_avg / exp_avg_sq; its param groups carry wd_mult, lr_mult and the
effective weight decay). A RemoteOptimizer that loads it continues the run as the torch optimizer
does; the state it hands back is the torch optimizer's. The real package is used where it
imports (megatron-core needs Python >= 3.12 and is not part of the test environment).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

import pytest
import torch

import optstep
from optstep import config
from optstep.megatron import from_optstep, to_optstep
from optstep.torch import RemoteOptimizer
from support import assert_params_close, make_data, make_mlp, train

LR, WD = 1e-2, 0.1


def _local_adamw(model: torch.nn.Module) -> Tuple[torch.optim.AdamW, List[str]]:
    """torch AdamW in Megatron's two groups (decay, no decay); answers the names in index order."""
    named = list(model.named_parameters())
    decay = [(n, p) for n, p in named if p.ndim > 1]
    no_decay = [(n, p) for n, p in named if p.ndim <= 1]
    opt = torch.optim.AdamW([
        {"params": [p for _, p in decay], "weight_decay": WD, "wd_mult": 1.0, "lr_mult": 1.0},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0, "wd_mult": 0.0,
         "lr_mult": 1.0}], lr=LR)
    return opt, [n for n, _ in decay + no_decay]


def _megatron_list(opt: torch.optim.AdamW) -> List[Dict[str, Any]]:
    """ChainedOptimizer.state_dict() of a chain of one Adam: [{"optimizer": {...}}]."""
    return [{"optimizer": copy.deepcopy(opt.state_dict())}]


def _megatron_flat(opt: torch.optim.AdamW, names: List[str]) -> Dict[str, Any]:
    """The same state as megatron-core's distributed checkpoint names it (chained_0.)."""
    saved = opt.state_dict()
    flat: Dict[str, Any] = {}
    for index, per_param in saved["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            flat[f"chained_0.optimizer.state.{key}.{names[index]}"] = per_param[key].clone()
        flat["common_step"] = int(per_param["step"].item())
    flat["chained_0.optimizer.param_groups"] = [
        dict({k: v for k, v in g.items() if k != "params"}, params=[names[i] for i in g["params"]])
        for g in saved["param_groups"]]
    return flat


def _trained(seed: int, steps: int):
    model, (x, y) = make_mlp(seed), make_data(seed + 1)
    local, names = _local_adamw(model)
    train(model, local, x, y, steps)
    return model, local, names, x, y


@pytest.mark.parametrize("form", ["list", "flat"])
def test_a_megatron_state_continues_on_optstep(client: optstep.Client, form: str) -> None:
    model, local, names, x, y = _trained(40, 4)
    megatron = _megatron_list(local) if form == "list" else _megatron_flat(local, names)
    remote_model = copy.deepcopy(model)
    remote = RemoteOptimizer(remote_model, client,
                             optimizer=config.chain(config.adamw(lr=LR, weight_decay=WD)))
    remote.load_state_dict(to_optstep(megatron, remote, param_names=[names]))
    assert remote.next_step == 5
    train(model, local, x, y, 6)
    train(remote_model, remote, x, y, 6)
    assert_params_close(remote_model, model, rtol=1e-5)

    back = from_optstep(remote.state_dict(), [names], flat=(form == "flat"))
    want = local.state_dict()["state"]
    for index, name in enumerate(names):
        for key in ("exp_avg", "exp_avg_sq"):
            got = (back[f"chained_0.optimizer.state.{key}.{name}"] if form == "flat"
                   else back[0]["optimizer"]["state"][index][key])
            torch.testing.assert_close(got, want[index][key], rtol=1e-4, atol=1e-7)
    steps = back["common_step"] if form == "flat" else back[0]["optimizer"]["state"][0]["step"]
    assert steps == 10


def test_two_sub_optimizers_round_trip(client: optstep.Client) -> None:
    """chained_0 (SGD with momentum, the matrices) and chained_1 (AdamW, the rest) out of one
    session and into another: it continues bit for bit."""
    model, (x, y) = make_mlp(42), make_data(43)
    chain = config.chain(config.sgd(lr=0.1, momentum=0.9), config.adamw(lr=LR))
    first = RemoteOptimizer(model, client, optimizer=chain)
    train(model, first, x, y, 3)
    matrices = [n for n, p in model.named_parameters() if p.ndim > 1]
    others = [n for n, p in model.named_parameters() if p.ndim <= 1]
    megatron = from_optstep(first.state_dict(), [matrices, others])
    assert any(k.startswith("chained_0.optimizer.state.momentum_buffer.") for k in megatron)
    assert any(k.startswith("chained_1.optimizer.state.exp_avg.") for k in megatron)

    other = copy.deepcopy(model)
    second = RemoteOptimizer(other, client, optimizer=chain)
    second.load_state_dict(to_optstep(megatron, second))
    train(model, first, x, y, 3)
    train(other, second, x, y, 3)
    for (name, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), name


def test_a_disagreeing_wd_mult_and_an_unknown_parameter_are_refused(
        client: optstep.Client) -> None:
    model, local, names, _, _ = _trained(44, 1)
    remote = RemoteOptimizer(copy.deepcopy(model), client,
                             optimizer=config.chain(config.adamw(lr=LR, weight_decay=WD)))
    wrong = _megatron_list(local)
    for group in wrong[0]["optimizer"]["param_groups"]:
        group["wd_mult"] = 1.0
    with pytest.raises(ValueError, match="wd_mult 1.0, the session's 0.0"):
        to_optstep(wrong, remote, param_names=[names])
    flat = _megatron_flat(local, names)
    flat["chained_0.optimizer.state.exp_avg.decoder.missing.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="'decoder.missing.weight' is not a parameter"):
        to_optstep(flat, remote)


def test_the_real_megatron_core_names_its_chained_state_so() -> None:
    """Where megatron-core imports: its ChainedOptimizer prefixes each sub-optimizer's
    checkpoint keys with 'chained_<i>.' and its optimizers name the state
    'optimizer.state.<key>' (the layout optstep.megatron reads)."""
    import inspect

    optimizer = pytest.importorskip(
        "megatron.core.optimizer",
        reason="megatron-core is not installed: it needs Python >= 3.12 (this test environment "
               "is Debian's 3.11) and torch with CUDA; the layout is checked above on a state "
               "built here")
    source = inspect.getsource(optimizer.ChainedOptimizer)
    assert "chained_" in source
    assert "optimizer.state" in inspect.getsource(inspect.getmodule(optimizer.ChainedOptimizer))
