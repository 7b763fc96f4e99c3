#!/usr/bin/env python3
"""Scale model of optstep for GPT-like models with AdamW (docs/scale.md).

For each model and world size: the bytes the busiest rank holds (masters, optimizer state,
gradient buffers, other buffers), today (every rank keeps every fp32 master and a bf16 snapshot
of all parameters) and in the owner-only design (a rank keeps what it owns plus bounded buffers),
with and without the redundant copy (--state_redundancy=1: each rank also holds its
predecessor's owned masters, state and gradient buffers); the bytes per step on the busiest
rank's link for SHARDED and REPLICATED trainers; a step-time estimate from rates measured by this
repository's benchmarks; the fewest ranks that hold each model within a rank's budget.

The per-rank loads come from the real partition: `partition_bench --scale` runs the engine's
PartitionByCostAndMemory on the layout. Build it first:

    bazel build //bench:partition_bench
    python3 bench/scale_model.py > scale_tables.md

($OPTSTEP_PARTITION_BENCH names another partition_bench binary.)

With --check it runs step_bench here instead ($OPTSTEP_STEP_BENCH names another binary) and
prints the model against measured steps of 1.3B on 2 and 4 ranks, its rates taken from a smaller
run of the same kind (about two minutes per world size, 19 GB of memory):

    bazel build -c opt //bench:step_bench //bench:partition_bench
    python3 bench/scale_model.py --check

Every rate is a constant below with the benchmark it comes from (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterable, List, Optional

Row = Dict[str, Any]  # one JSON object of partition_bench --scale

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARTITION_BENCH = ROOT / "bazel-bin" / "bench" / "partition_bench"

# AdamW: fp32 master, two fp32 moments, fp32 gradient buffer (EstimateOwnedBytes).
MASTER_BYTES, STATE_BYTES, GRADIENT_BYTES = 4, 8, 4
OWNED_BYTES = MASTER_BYTES + STATE_BYTES + GRADIENT_BYTES
# server/engine/footprint.h: kParamOverheadBytes, kSessionOverheadBytes.
PARAM_OVERHEAD_BYTES, SESSION_OVERHEAD_BYTES = 1536, 256 << 10
# The owner-only design's bounded staging (not built yet): 4 buckets of the 16 MiB the step's
# pipeline hands on at a time.
STAGING_BYTES = 4 * (16 << 20)
# server/engine/memory_budget.h: kDefaultMemoryBudgetFraction.
BUDGET_FRACTION = 0.8
# An H200 (vendor figure): 141 GB of HBM3e at 4.8 TB/s.
H200_BYTES, H200_HBM_BYTES_PER_S = 141e9, 4.8e12

# Measured here (docs/benchmarks.md), 2-vCPU development machine:
# kernels_bench: AdamW, 64M parameters, 2 threads: 1.45 G parameters/s, 0.83 of the triad.
CPU_ADAMW_PARAMS_PER_S = 1.45e9
ADAMW_TRIAD_RATIO = 0.83
ADAMW_TRAFFIC_BYTES = 28  # read g, p, m, v; write p, m, v (fp32)
# transport_bench: the server's gradient ingest / raw TCP, median of 12 runs, 4 connections.
INGEST_EFFICIENCY = 0.63
# comm_bench: Gloo all-gather-v / raw exchange of the same bytes, 256 MiB, 2 ranks.
ALLGATHER_EFFICIENCY = 0.58
# Egress (parameters to trainers) is gRPC streaming like ingest; not measured against raw TCP,
# taken as the ingest's.
EGRESS_EFFICIENCY = INGEST_EFFICIENCY


@dataclasses.dataclass(frozen=True)
class Model:
    """A GPT-like layout: fused QKV (K and V of kv_hidden), FFN (gated: fused gate and up),
    untied embedding and output layer."""
    name: str
    layers: int
    hidden: int
    ffn: int
    vocab: int
    kv_hidden: int = 0
    gated: bool = False
    bias: bool = True

    def flags(self) -> List[str]:
        """The layout's flags (bench/gpt_like_layout.h), for partition_bench and step_bench."""
        return [f"--layers={self.layers}", f"--hidden={self.hidden}", f"--ffn={self.ffn}",
                f"--vocab={self.vocab}", f"--kv_hidden={self.kv_hidden}",
                "--gated" if self.gated else "--nogated", "--bias" if self.bias else "--nobias"]


MODELS = [
    Model("1.3B", 24, 2048, 8192, 50257),                                # GPT-3 XL shapes
    Model("7B", 32, 4096, 11008, 32000, gated=True, bias=False),         # Llama-2 7B shapes
    Model("70B", 80, 8192, 28672, 128256, 1024, gated=True, bias=False),  # Llama-3 70B
    Model("405B", 126, 16384, 53248, 128256, 1024, gated=True, bias=False),  # Llama-3.1 405B
]
WORLDS = [8, 16, 32, 64, 128, 256, 512, 1024]


def partition(model: Model, worlds: Iterable[int], binary: Optional[pathlib.Path] = None,
              preset: Iterable[str] = ("--preset=adam",)) -> Dict[int, Row]:
    """partition_bench --scale's JSON object per world size: the layout's counts and the
    partition's peaks (owned_bytes_max, owned_with_shadow_max, peak_rank_numel, ...) under the
    optimizer `preset` (its flags; AdamW by default). `binary`: $OPTSTEP_PARTITION_BENCH, else
    bazel-bin/bench/partition_bench."""
    binary = binary or pathlib.Path(os.environ.get("OPTSTEP_PARTITION_BENCH", PARTITION_BENCH))
    if not binary.is_file():
        sys.exit(f"no {binary}: bazel build //bench:partition_bench")
    out = subprocess.run([str(binary), "--scale", *model.flags(), *preset,
                          "--worlds=" + ",".join(str(w) for w in worlds)],
                         check=True, capture_output=True, text=True).stdout
    return {row["world"]: row for row in map(json.loads, out.splitlines())}


@dataclasses.dataclass(frozen=True)
class RankBytes:
    """What the busiest rank holds, by kind."""
    masters: float
    state: float
    gradients: float
    buffers: float  # snapshots of returned parameters, staging, per-parameter records
    shadow: float   # the predecessor's owned part (state redundancy)

    @property
    def total(self) -> float:
        return self.masters + self.state + self.gradients + self.buffers + self.shadow


def rank_bytes(p: Row, owner_only: bool, redundancy: bool, snapshot: bool = True,
               state_bytes: int = STATE_BYTES) -> RankBytes:
    """Today every rank keeps every fp32 master and a bf16 snapshot of every parameter; owner-only
    keeps the owned masters, a bf16 snapshot of them (`snapshot`; without it each parameter is
    converted into the staging buffers as it goes out) and the staging buffers. `state_bytes`:
    the optimizer state per owned parameter (AdamW's two fp32 moments by default)."""
    n, total = p["peak_rank_numel"], p["numel"]
    overhead = PARAM_OVERHEAD_BYTES * p["params"] + SESSION_OVERHEAD_BYTES
    shadow = p["owned_with_shadow_max"] - p["owned_bytes_max"] if redundancy else 0.0
    if owner_only:
        return RankBytes(MASTER_BYTES * n, state_bytes * n, GRADIENT_BYTES * n,
                         (2 * n if snapshot else 0) + STAGING_BYTES + overhead, shadow)
    return RankBytes(MASTER_BYTES * total, state_bytes * n, GRADIENT_BYTES * n,
                     2 * total + overhead, shadow)


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes per step on the busiest rank's link."""
    gradients_in: float  # from the trainers
    gather: float        # the masters' all-gather, each direction (today only)
    parameters_out: float  # bf16 parameters to the trainers

    @property
    def inbound(self) -> float:
        return self.gradients_in + self.gather

    @property
    def outbound(self) -> float:
        return self.gather + self.parameters_out


TODAY, DIRECT, RELAY = "today", "direct", "relay"


def traffic(p: Row, world: int, trainers: int, replicated: bool, path: str,
            grad_bytes: int = 2, param_bytes: int = 2) -> Traffic:
    """SHARDED: each gradient element arrives once, from one trainer; REPLICATED: from every
    trainer. How the parameters reach the trainers:
      today  the ranks all-gather the fp32 masters (a ring: each rank receives and sends the
             others' masters), then each trainer gets every parameter from its home rank
             (trainer % world) in bf16;
      direct (owner-only) each trainer gets each parameter from its owner;
      relay  (owner-only) the owners stream their parameters in bf16 round the ring of ranks
             (each rank receives and forwards the others'), each rank serves its home trainers."""
    n, total = p["peak_rank_numel"], p["numel"]
    gradients = n * grad_bytes * (trainers if replicated else 1)
    homed = math.ceil(trainers / world)
    if path == DIRECT:
        return Traffic(gradients, 0.0, trainers * n * param_bytes)
    if path == RELAY:
        return Traffic(gradients, param_bytes * (total - n), homed * total * param_bytes)
    return Traffic(gradients, MASTER_BYTES * (total - n), homed * total * param_bytes)


@dataclasses.dataclass(frozen=True)
class StepTime:
    ingest: float   # gradients in: nothing overlaps it (the global norm needs every gradient)
    compute: float  # AdamW over the owned parameters
    network: float  # what follows the agreement on the link: all-gather and egress
    total: float    # ingest + max(compute, network): the pipelined step

    @property
    def network_bound(self) -> bool:
        return self.ingest + self.network > self.compute


def step_time(p: Row, t: Traffic, link_bytes_per_s: float,
              adamw_params_per_s: float) -> StepTime:
    """The relay is taken at the all-gather's efficiency (a ring of the same bytes)."""
    ingest = t.gradients_in / (link_bytes_per_s * INGEST_EFFICIENCY)
    gather = t.gather / (link_bytes_per_s * ALLGATHER_EFFICIENCY)
    egress = t.parameters_out / (link_bytes_per_s * EGRESS_EFFICIENCY)
    compute = p["peak_rank_numel"] / adamw_params_per_s
    network = gather + egress  # outbound: the gather's sends and the egress share the link
    return StepTime(ingest, compute, network, ingest + max(compute, network))


def device_adamw_params_per_s(hbm_bytes_per_s: float) -> float:
    """AdamW at the fraction of the memory bandwidth kernels_bench measured on the CPU."""
    return hbm_bytes_per_s * ADAMW_TRIAD_RATIO / ADAMW_TRAFFIC_BYTES


def min_ranks(model: Model, budget: float, owner_only: bool, redundancy: bool,
              snapshot: bool = True, largest: int = 4096,
              binary: Optional[pathlib.Path] = None) -> Optional[int]:
    """The fewest ranks (redundancy: at least 2) whose busiest rank fits `budget`; None when no
    world size up to `largest` does."""
    first = 2 if redundancy else 1
    probe = partition(model, [first], binary)[first]
    if not owner_only:  # every rank holds every master: more ranks shrink only the owned part
        if (MASTER_BYTES + 2) * probe["numel"] > budget:
            return None
    need = OWNED_BYTES * probe["numel"] * (2 if redundancy else 1)
    world = max(first, math.ceil(need / budget))
    while world <= largest:
        batch = list(range(world, min(largest, world + 15) + 1))
        rows = partition(model, batch, binary)
        for w in batch:
            if rank_bytes(rows[w], owner_only, redundancy, snapshot).total <= budget:
                return w
        world = batch[-1] + 1
    return None


def gb(x: float) -> str:
    return f"{x / 1e9:.1f}" if x < 1e12 else f"{x / 1e12:.2f} T"


def seconds(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.1f} s"


def tables(models: List[Model], worlds: List[int], link_bytes_per_s: float,
           hbm_bytes_per_s: float, device_bytes: float) -> str:
    device_rate = device_adamw_params_per_s(hbm_bytes_per_s)
    lines: List[str] = []
    for model in models:
        rows = partition(model, worlds)
        first = rows[worlds[0]]
        lines += [f"### {model.name}: {first['numel'] / 1e9:.2f}B parameters, "
                  f"{first['params']} tensors, largest {first['largest_numel'] / 1e9:.2f}B", ""]
        lines += ["Bytes on the busiest rank, GB (owned masters / state / gradients; buffers):",
                  "",
                  "| ranks | owned peak / mean | masters | state | gradients | today | "
                  "owner-only | owner-only + redundancy |",
                  "|---|---|---|---|---|---|---|---|"]
        for w in worlds:
            p = rows[w]
            own = rank_bytes(p, True, False)
            lines.append(
                f"| {w} | {p['owned_bytes_max'] / (p['owned_bytes_total'] / w):.2f} | "
                f"{gb(own.masters)} | {gb(own.state)} | {gb(own.gradients)} | "
                f"{gb(rank_bytes(p, False, False).total)} | {gb(own.total)} | "
                f"{gb(rank_bytes(p, True, True).total)} |")
        lines += ["",
                  "Per step on the busiest rank's link, one trainer per rank, GB: gradients in;",
                  "the ranks' ring (each way); parameters out to trainers. Step: the estimate",
                  "with the device AdamW rate, `net` where the link takes longer than AdamW;",
                  "AdamW alone on the busiest rank (device; CPU):", "",
                  "| ranks | grads in SHARDED / REPLICATED | ring today / relay | "
                  "params out today / direct / relay | step SHARDED today / direct / relay | "
                  "step REPLICATED relay | AdamW device; CPU |",
                  "|---|---|---|---|---|---|---|"]
        for w in worlds:
            p = rows[w]
            sharded = {path: traffic(p, w, w, False, path) for path in (TODAY, DIRECT, RELAY)}
            replicated = traffic(p, w, w, True, RELAY)

            def step(t: Traffic) -> str:
                est = step_time(p, t, link_bytes_per_s, device_rate)
                return seconds(est.total) + (" net" if est.network_bound else "")

            lines.append(
                f"| {w} | {gb(sharded[TODAY].gradients_in)} / {gb(replicated.gradients_in)} | "
                f"{gb(sharded[TODAY].gather)} / {gb(sharded[RELAY].gather)} | "
                + " / ".join(gb(sharded[x].parameters_out) for x in (TODAY, DIRECT, RELAY))
                + " | " + " / ".join(step(sharded[x]) for x in (TODAY, DIRECT, RELAY))
                + f" | {step(replicated)} | {seconds(p['peak_rank_numel'] / device_rate)}; "
                f"{seconds(p['peak_rank_numel'] / CPU_ADAMW_PARAMS_PER_S)} |")
        lines.append("")
    for fraction in (BUDGET_FRACTION, 1.0):
        budget = device_bytes * fraction
        lines += [f"### Fewest ranks within {gb(budget)} GB per rank "
                  f"({fraction:.0%} of {gb(device_bytes)} GB)", "",
                  "| model | today | owner-only | owner-only, no snapshot | "
                  "owner-only + redundancy | owner-only + redundancy, no snapshot |",
                  "|---|---|---|---|---|---|"]
        for model in models:
            cells = []
            for owner_only, redundancy, snapshot in ((False, False, True), (True, False, True),
                                                     (True, False, False), (True, True, True),
                                                     (True, True, False)):
                fewest = min_ranks(model, budget, owner_only, redundancy, snapshot)
                cells.append("none" if fewest is None else str(fewest))
            lines.append(f"| {model.name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


# --check: the model against runs measured here (docs/scale.md, "Checks against measurements").
STEP_BENCH = ROOT / "bazel-bin" / "bench" / "step_bench"
# The run whose rates the check takes: GPT-2 small's shapes in the GPT-like layout (164M).
CALIBRATION = Model("164M", 12, 768, 3072, 50257)
# What fits this machine's 24 GiB at 1.3B: SGD without momentum (no optimizer state; AdamW's 8
# bytes per parameter would need 11 GB more), OWNERS storage (no replica), one trainer sending
# bf16 gradients and getting bf16 parameters written into its own buffers.
CHECK_RUN_FLAGS = ["--gpt_like", "--optimizer=sgd", "--owners", "--trainers=1",
                   "--bf16_gradients", "--destinations", "--nopull_alone"]
CHECK_PRESET = ["--preset=sgd", "--preset_args=sgd_momentum=0"]
CHECK_STATE_BYTES = 0
CHECK_TOLERANCE = 0.25


def run_step_bench(model: Model, world: int, steps: int,
                   binary: Optional[pathlib.Path] = None) -> Row:
    """step_bench's --json figures for `model` on `world` ranks with CHECK_RUN_FLAGS. `binary`:
    $OPTSTEP_STEP_BENCH, else bazel-bin/bench/step_bench (build it with -c opt)."""
    binary = binary or pathlib.Path(os.environ.get("OPTSTEP_STEP_BENCH", STEP_BENCH))
    if not binary.is_file():
        sys.exit(f"no {binary}: bazel build -c opt //bench:step_bench")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "run.json"
        run = subprocess.run([str(binary), *model.flags(), *CHECK_RUN_FLAGS, f"--ranks={world}",
                              f"--steps={steps}", f"--json={out}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if run.returncode != 0:
            sys.exit(f"step_bench for {model.name} on {world} ranks failed ({run.returncode}):\n"
                     + "\n".join(run.stderr.splitlines()[-20:]))
        figures: Row = json.loads(out.read_text())
        return figures


def measured_step(run: Row) -> StepTime:
    """A step_bench run's mean phases as the model's terms, in seconds: ingest, the step phase
    (statistics, agreement and the update), the egress to the trainer, and the wall."""
    return StepTime(run["ingest_ms"] / 1e3, run["step_ms"] / 1e3, run["egress_ms"] / 1e3,
                    run["wall_ms"] / 1e3)


def predict_step(calibration: Row, target: Row) -> StepTime:
    """The model's step (ingest + max(compute, network)) for the target run, from the rates of a
    calibration run of the same flags on the same host: seconds per gradient byte in, per
    parameter stepped and per parameter byte out. On one host the ranks share the cores and the
    loopback, so the host is the busiest rank, with the whole model."""
    cal = measured_step(calibration)
    ingest = cal.ingest * target["gradient_bytes_in"] / calibration["gradient_bytes_in"]
    compute = cal.compute * target["numel"] / calibration["numel"]
    network = cal.network * target["parameter_bytes_out"] / calibration["parameter_bytes_out"]
    return StepTime(ingest, compute, network, ingest + max(compute, network))


def predict_host_bytes(p: Row, run: Row) -> float:
    """What the host holds by the model: every rank's owned masters, state and gradient buffers
    (the partition's total), the ranks' bf16 snapshots of their parameters (one copy of the
    model), the trainer's gradient and parameter buffers, and the process's fixed part (what it
    held before the session, measured)."""
    return float(p["owned_bytes_total"] + 2 * p["numel"] + run["gradient_bytes_in"] +
                 run["parameter_bytes_out"] + run["before_session_bytes"])


def held_max(run: Row) -> int:
    """The busiest rank's masters, state and gradient buffers as its session counts them."""
    return max(int(r["param_bytes"] + r["state_bytes"] + r["buffer_bytes"])
               for r in run["ranks_held"])


def check_rows(model: Model, world: int, calibration: Row, target: Row, p: Row) -> List[str]:
    """Markdown rows: predicted, measured and their error for each phase, the step wall, the
    busiest rank's owned bytes and the host's peak RSS."""
    predicted, measured = predict_step(calibration, target), measured_step(target)
    owned = rank_bytes(p, owner_only=True, redundancy=False, state_bytes=CHECK_STATE_BYTES)
    pairs = [("ingest", predicted.ingest, measured.ingest, seconds),
             ("step (compute)", predicted.compute, measured.compute, seconds),
             ("egress (network)", predicted.network, measured.network, seconds),
             ("**step wall**", predicted.total, measured.total, seconds),
             ("busiest rank: masters, state, gradients, GB",
              owned.masters + owned.state + owned.gradients, held_max(target), gb),
             ("host peak RSS, GB", predict_host_bytes(p, target), target["peak_rss_bytes"], gb)]
    return [f"| {model.name} | {world} | {name} | {fmt(x)} | {fmt(y)} | {(x - y) / y:+.0%} |"
            for name, x, y, fmt in pairs]


def check(models: List[Model], worlds: List[int], steps: int) -> int:
    """Runs step_bench for CALIBRATION and each model on each world size; prints the model's
    figures against the measured ones. Fails when a predicted step wall is more than
    CHECK_TOLERANCE off."""
    lines = ["| model | ranks | figure | predicted | measured | error |",
             "|---|---|---|---|---|---|"]
    worst = 0.0
    for world in worlds:
        calibration = run_step_bench(CALIBRATION, world, steps)
        for model in models:
            target = run_step_bench(model, world, steps)
            p = partition(model, [world], preset=CHECK_PRESET)[world]
            lines += check_rows(model, world, calibration, target, p)
            predicted, measured = predict_step(calibration, target), measured_step(target)
            worst = max(worst, abs(predicted.total - measured.total) / measured.total)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if worst <= CHECK_TOLERANCE else 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link_gbps", type=float, default=400.0,
                        help="each rank's network link, Gbit/s each way (default 400)")
    parser.add_argument("--hbm_tbps", type=float, default=H200_HBM_BYTES_PER_S / 1e12,
                        help="device memory bandwidth, TB/s, for the device AdamW rate")
    parser.add_argument("--device_gb", type=float, default=H200_BYTES / 1e9,
                        help="device memory, GB (the budget is 80%% of it)")
    parser.add_argument("--models", help="default: every model (--check: 1.3B)")
    parser.add_argument("--worlds", help="default: 8 to 1024 (--check: 2,4)")
    parser.add_argument("--check", action="store_true",
                        help="run step_bench here instead (--models, default 1.3B, on --worlds, "
                        "default 2,4) and print the model against the measured step")
    parser.add_argument("--steps", type=int, default=5,
                        help="--check: steps per run, the first a warm-up")
    args = parser.parse_args(argv)
    names = (args.models or ("1.3B" if args.check else ",".join(m.name for m in MODELS)))
    chosen = [m for m in MODELS if m.name in names.split(",")]
    worlds = [int(w) for w in (args.worlds or ("2,4" if args.check else
                                               ",".join(str(w) for w in WORLDS))).split(",")]
    if args.check:
        if args.steps < 2:
            parser.error("--check needs --steps >= 2 (the first step warms up)")
        return check(chosen, worlds, args.steps)
    sys.stdout.write(tables(chosen, worlds, args.link_gbps * 1e9 / 8, args.hbm_tbps * 1e12,
                            args.device_gb * 1e9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
