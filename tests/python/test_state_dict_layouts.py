"""Client.export_state_dict's keyed layouts (by model chunk, by sub-optimizer) and their import."""

from __future__ import annotations

import numpy as np
import pytest

import optstep
from optstep import config, pb


def _session(client: optstep.Client, name: str) -> str:
    spec = pb.SessionSpec(
        name=name, num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
        parameters=[pb.ParameterSpec(name="a.w", shape=[3, 4], model_chunk=0),
                    pb.ParameterSpec(name="a.b", shape=[4], model_chunk=0),
                    pb.ParameterSpec(name="b.w", shape=[4, 2], model_chunk=1)],
        optimizer=config.chain(config.adamw(lr=1e-2), config.sgd(lr=0.1, momentum=0.9),
                               rules=[config.rule("sgd", name_glob="b.*")], clip_grad=0))
    info, _ = client.create_session(spec)
    return info.session_id


def _stepped(client: optstep.Client, name: str) -> str:
    session = _session(client, name)
    rng = np.random.default_rng(3)
    shapes = {"a.w": (3, 4), "a.b": (4,), "b.w": (4, 2)}
    client.init_parameters(session, {n: rng.standard_normal(s).astype(np.float32)
                                     for n, s in shapes.items()})
    for step in (1, 2):
        client.step(session, step, {n: rng.standard_normal(s).astype(np.float32)
                                    for n, s in shapes.items()})
    return session


def test_by_model_chunk_and_by_sub_optimizer(client: optstep.Client) -> None:
    session = _stepped(client, "layouts")
    merged = client.export_state_dict(session)
    by_chunk = client.export_state_dict(session, layout="by_model_chunk")
    assert sorted(by_chunk) == ["model0", "model1"]
    assert "param/a.w" in by_chunk["model0"] and "param/b.w" in by_chunk["model1"]
    assert "param/b.w" not in by_chunk["model0"]
    np.testing.assert_array_equal(by_chunk["model1"]["param/b.w"], merged["param/b.w"])
    prefixed = client.export_state_dict(session, layout="by_model_chunk", chunk_prefix="model_")
    assert sorted(prefixed) == ["model_0", "model_1"]

    by_sub = client.export_state_dict(session, layout="by_sub_optimizer")
    # a.b is AdamW's (1-D), a.w and b.w are SGD's (2-D, and the rule): AdamW has parameters in
    # chunk 0 only, SGD in both; a chunk goes whole to each of its sub-optimizers (spec §7.2).
    assert sorted(by_sub) == ["adamw", "sgd"]
    assert sorted(by_sub["adamw"]) == ["model0"] and sorted(by_sub["sgd"]) == ["model0", "model1"]
    assert "state/adamw/a.b/exp_avg" in by_sub["adamw"]["model0"]
    np.testing.assert_array_equal(by_sub["sgd"]["model1"]["state/sgd/b.w/momentum_buffer"],
                                  merged["state/sgd/b.w/momentum_buffer"])


@pytest.mark.parametrize("layout", ["by_model_chunk", "by_sub_optimizer"])
def test_a_keyed_dict_imports_back(client: optstep.Client, layout: str) -> None:
    source = _stepped(client, f"source-{layout}")
    keyed = client.export_state_dict(source, layout=layout)
    target = _session(client, f"target-{layout}")
    imported = client.import_state_dict(target, keyed)
    assert imported.HasField("step") and imported.step == 2  # the dict's meta/step, applied
    want, got = client.export_state_dict(source), client.export_state_dict(target)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_an_unknown_layout_is_refused(client: optstep.Client) -> None:
    with pytest.raises(optstep.InvalidArgumentError, match="by_model_chunk"):
        client.export_state_dict("any", layout="by_rank")
