"""bench/scale_model.py: its partition rows come from the engine's partition (partition_bench
--scale) and agree with a layout counted here; its bytes, traffic and step-time arithmetic
against hand computation; the fewest ranks it reports is the least that fits."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any, Dict

import pytest

from repository import REPOSITORY_ROOT, bazel_binary_path


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "scale_model", REPOSITORY_ROOT / "bench" / "scale_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_model"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sm = _load()
TINY = sm.Model("tiny", layers=2, hidden=64, ffn=256, vocab=1000, kv_hidden=32, gated=True,
                bias=False)


@pytest.fixture(scope="module")
def binary() -> pathlib.Path:
    """$OPTSTEP_PARTITION_BENCH, else bazel-bin/bench/partition_bench, built when missing."""
    return pathlib.Path(bazel_binary_path("OPTSTEP_PARTITION_BENCH", "//bench:partition_bench"))


def _tiny_numels() -> list[int]:
    """TINY's tensors counted independently: embedding, per layer (norm, fused QKV with K and V
    of 32, projection, norm, fused gate and up, down), final norm, output layer."""
    h, kv, ffn, vocab = 64, 32, 256, 1000
    layer = [h, (h + 2 * kv) * h, h * h, h, 2 * ffn * h, h * ffn]
    return [vocab * h] + layer * 2 + [h, vocab * h]


def test_rows_follow_the_layout_and_bound_the_peak(binary: pathlib.Path) -> None:
    numels = _tiny_numels()
    rows = sm.partition(TINY, [1, 2, 3, 8], binary)
    for world, row in rows.items():
        assert row["params"] == len(numels)
        assert row["numel"] == sum(numels)
        assert row["largest_numel"] == max(numels)
        assert row["owned_bytes_total"] == 16 * sum(numels)  # AdamW: master, 2 moments, grad
        assert row["owned_bytes_max"] == 16 * row["peak_rank_numel"]
        mean = row["owned_bytes_total"] / world
        assert row["owned_bytes_max"] >= row["owned_bytes_bound"]
        assert row["owned_bytes_bound"] >= max(mean, 16 * max(numels)) - 0.5  # printed %.0f
        assert row["owned_with_shadow_max"] >= row["owned_bytes_max"]
    assert rows[1]["owned_bytes_max"] == rows[1]["owned_bytes_total"]
    assert rows[1]["owned_with_shadow_max"] == rows[1]["owned_bytes_max"]
    # The two largest tensors (embedding and output, 64000 elements each) on two ranks: apart.
    assert rows[2]["peak_rank_numel"] < sum(numels) - 64000


ROW: Dict[str, Any] = {"numel": 1000, "peak_rank_numel": 300, "params": 10,
                       "owned_bytes_max": 4800, "owned_with_shadow_max": 8000}


def test_rank_bytes_by_hand() -> None:
    overhead = 1536 * 10 + (256 << 10)
    today = sm.rank_bytes(ROW, owner_only=False, redundancy=False)
    assert (today.masters, today.state, today.gradients) == (4000, 2400, 1200)
    assert today.buffers == 2000 + overhead and today.shadow == 0
    owner = sm.rank_bytes(ROW, owner_only=True, redundancy=True)
    assert (owner.masters, owner.state, owner.gradients) == (1200, 2400, 1200)
    assert owner.buffers == 600 + 64 * 2**20 + overhead
    assert owner.shadow == 3200  # the predecessor's owned bytes
    bare = sm.rank_bytes(ROW, owner_only=True, redundancy=False, snapshot=False)
    assert bare.total == 4800 + 64 * 2**20 + overhead


def test_traffic_and_step_time_by_hand() -> None:
    # 4 ranks, 8 trainers (2 per home rank), bf16 gradients and parameters.
    today = sm.traffic(ROW, 4, 8, replicated=False, path=sm.TODAY)
    assert (today.gradients_in, today.gather, today.parameters_out) == (600, 2800, 4000)
    direct = sm.traffic(ROW, 4, 8, replicated=True, path=sm.DIRECT)
    assert (direct.gradients_in, direct.gather, direct.parameters_out) == (4800, 0, 4800)
    relay = sm.traffic(ROW, 4, 8, replicated=False, path=sm.RELAY)
    assert (relay.gradients_in, relay.gather, relay.parameters_out) == (600, 1400, 4000)
    assert (relay.inbound, relay.outbound) == (2000, 5400)
    link = 1000.0
    t = sm.step_time(ROW, relay, link, adamw_params_per_s=100.0)
    assert t.ingest == pytest.approx(600 / (link * sm.INGEST_EFFICIENCY))
    assert t.network == pytest.approx(1400 / (link * sm.ALLGATHER_EFFICIENCY) +
                                      4000 / (link * sm.EGRESS_EFFICIENCY))
    assert t.compute == pytest.approx(3.0)
    assert t.total == pytest.approx(t.ingest + max(t.compute, t.network))
    assert t.network_bound
    assert not sm.step_time(ROW, relay, 1e9, adamw_params_per_s=100.0).network_bound


def test_fewest_ranks_is_the_least_that_fits(binary: pathlib.Path) -> None:
    rows = sm.partition(TINY, range(1, 9), binary)
    budget = sm.rank_bytes(rows[3], True, False, snapshot=False).total
    fewest = sm.min_ranks(TINY, budget, owner_only=True, redundancy=False, snapshot=False,
                          binary=binary)
    assert fewest is not None and fewest <= 3
    assert sm.rank_bytes(rows[fewest], True, False, snapshot=False).total <= budget
    for world in range(1, fewest):
        assert sm.rank_bytes(rows[world], True, False, snapshot=False).total > budget
    # Today every rank holds every master and a bf16 snapshot: below that nothing fits.
    assert sm.min_ranks(TINY, 6 * rows[1]["numel"] - 1, owner_only=False, redundancy=False,
                        binary=binary) is None


def test_tables_print_every_model_and_the_fewest_ranks(binary: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTSTEP_PARTITION_BENCH", str(binary))
    text = sm.tables([TINY], [2, 4], link_bytes_per_s=50e9, hbm_bytes_per_s=4.8e12,
                     device_bytes=1e9)
    assert "### tiny" in text and "Fewest ranks within 0.8 GB" in text
    assert "| tiny | 1 | 1 | 1 | 2 | 2 |" in text


def test_check_preset_holds_no_state(binary: pathlib.Path) -> None:
    # SGD without momentum: a master and a gradient buffer per parameter (8 bytes), as the
    # check's runs hold; with the preset's default momentum it would be 12.
    row = sm.partition(TINY, [2], binary, preset=sm.CHECK_PRESET)[2]
    assert row["owned_bytes_total"] == 8 * sum(_tiny_numels())
    adam = sm.partition(TINY, [2], binary)[2]
    assert adam["owned_bytes_total"] == 16 * sum(_tiny_numels())


CALIBRATION_RUN: Dict[str, Any] = {
    "numel": 100, "gradient_bytes_in": 200, "parameter_bytes_out": 200,
    "ingest_ms": 10.0, "step_ms": 8.0, "egress_ms": 12.0, "wall_ms": 25.0}
TARGET_RUN: Dict[str, Any] = {
    "numel": 1000, "gradient_bytes_in": 2000, "parameter_bytes_out": 4000,
    "ingest_ms": 110.0, "step_ms": 70.0, "egress_ms": 250.0, "wall_ms": 300.0,
    "peak_rss_bytes": 20000, "before_session_bytes": 1000,
    "ranks_held": [{"param_bytes": 2000, "state_bytes": 0, "buffer_bytes": 2000},
                   {"param_bytes": 1990, "state_bytes": 0, "buffer_bytes": 1990}]}


def test_predict_step_scales_the_calibration_rates_by_hand() -> None:
    predicted = sm.predict_step(CALIBRATION_RUN, TARGET_RUN)
    # 10 ms per 200 bytes in, 8 ms per 100 parameters, 12 ms per 200 bytes out.
    assert predicted.ingest == pytest.approx(0.100)
    assert predicted.compute == pytest.approx(0.080)
    assert predicted.network == pytest.approx(0.240)
    assert predicted.total == pytest.approx(0.100 + 0.240)
    measured = sm.measured_step(TARGET_RUN)
    assert (measured.ingest, measured.compute, measured.network, measured.total) == \
        pytest.approx((0.110, 0.070, 0.250, 0.300))


def test_check_rows_give_each_figure_and_its_error() -> None:
    p = {"numel": 1000, "peak_rank_numel": 500, "params": 10, "owned_bytes_total": 8000}
    rows = sm.check_rows(TINY, 2, CALIBRATION_RUN, TARGET_RUN, p)
    assert rows[3] == "| tiny | 2 | **step wall** | 340 ms | 300 ms | +13% |"
    # 4 + 4 bytes per owned parameter (no state) against the busiest session's 4000.
    assert rows[4].endswith("| 0.0 | 0.0 | +0% |")
    # 8000 owned + 2000 of snapshots + 2000 in + 4000 out + 1000 fixed = 17000 against 20000.
    assert rows[5].endswith("| -15% |")
