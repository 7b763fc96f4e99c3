"""A module's parameters as ParameterSpecs, and the chain routing the server builds from them."""

from __future__ import annotations

import torch
from torch import nn

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer, describe_parameters


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.attn = nn.MultiheadAttention(8, num_heads=2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.frozen = nn.Parameter(torch.zeros(3), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(torch.tanh(self.fc(self.norm(h))))


def _specs(**kwargs) -> dict:
    return {d.name: d.spec for d in describe_parameters(TinyLM(), **kwargs)}


def test_detection() -> None:
    specs = _specs()
    assert "frozen" not in specs
    flagged = sorted(n for n, s in specs.items() if s.embedding_or_output)
    assert flagged == ["embed.weight", "head.weight"]
    qkv = specs["attn.in_proj_weight"].qkv
    assert (qkv.num_query_groups, qkv.q_per_group, qkv.head_dim) == (1, 1, 8)
    assert list(specs["attn.in_proj_weight"].shape) == [24, 8]
    assert not specs["fc.weight"].HasField("qkv")


def test_overrides() -> None:
    specs = _specs(embedding_or_output={"head.weight": False, "fc.*": True},
                   qkv={"fc.weight": (2, 1, 2)}, model_chunk={"embed.*": 1},
                   expert=["fc.bias"])
    assert not specs["head.weight"].embedding_or_output
    assert specs["fc.weight"].embedding_or_output and specs["fc.bias"].embedding_or_output
    assert specs["fc.weight"].qkv.num_query_groups == 2
    assert specs["embed.weight"].model_chunk == 1 and specs["fc.weight"].model_chunk == 0
    assert specs["fc.bias"].expert and not specs["fc.weight"].expert
    assert not _specs(detect_output=False)["head.weight"].embedding_or_output


def test_chain_routing_from_the_module(client: optstep.Client) -> None:
    """spec §4 through the server: 2-D hidden matrices to the matrix optimizer (here SGD, as a
    stand-in available in every build), flagged and 1-D parameters to AdamW; a rule first."""
    model = TinyLM()
    chain = config.chain(config.sgd(lr=0.1, name="matrix"), config.adamw(lr=1e-3),
                         rules=[config.rule("adamw", name_glob="attn.out_proj.weight", lr=5e-4)])
    opt = RemoteOptimizer(model, client, optimizer=chain)
    routed = {name: (g["sub_optimizer"], g["lr"], g["wd_mult"])
              for g in opt.param_groups for name in g["param_names"]}
    assert routed["attn.in_proj_weight"] == ("matrix", 0.1, 1.0)
    assert routed["fc.weight"] == ("matrix", 0.1, 1.0)
    assert routed["embed.weight"] == ("adamw", 1e-3, 1.0)
    assert routed["head.weight"] == ("adamw", 1e-3, 1.0)
    assert routed["norm.weight"] == ("adamw", 1e-3, 0.0)
    assert routed["fc.bias"] == ("adamw", 1e-3, 0.0)
    assert routed["attn.out_proj.weight"] == ("adamw", 5e-4, 1.0)

    tokens = torch.randint(0, 11, (4, 5), generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    opt.zero_grad()
    nn.functional.cross_entropy(model(tokens).reshape(-1, 11), tokens.reshape(-1)).backward()
    opt.step()
    after = [p for p in model.parameters() if p.requires_grad]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))
