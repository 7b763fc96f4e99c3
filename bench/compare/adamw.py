#!/usr/bin/env python3
"""AdamW on the CPU: optstep against torch (fused, foreach) and DeepSpeedCPUAdam, in one run.

Cases: one fp32 tensor of 16M and of 64M parameters, and the GPT-2-small layout (124M parameters
in 148 tensors, as bench/gpt_layout.cc defines it) and 2048 tensors of 16K parameters (32M), which
optstep steps in batches of tensors as its engine does ("optstep") and, for comparison, one
tensor at a time ("optstep per tensor").
Every optimizer steps the same sizes with lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay
0.01 (decoupled), on all cores. optstep's figures and the streaming triad come from
//bench:adamw_compare (Google Benchmark, JSON).

    bench/compare/adamw.sh              # makes the venv (bench/compare/venv.sh) and runs this

Each case runs --rounds rounds (optstep right after a streaming triad, then every reference), so
that a shared machine's changing load hits every optimizer alike; prints the medians over the
rounds of params/s per optimizer, of the per-round ratios optstep / reference (with their range),
and each optimizer's bus bandwidth (28 B a parameter) over the streaming triad's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

BYTES_PER_PARAM = 28  # reads g, p, m, v; writes p, m, v (fp32)
M = 1 << 20


def optstep_run(binary, min_time, params):
    """optstep's params/s on one case (`params` elements; 0 = the layout, -1 = the small tensors,
    both also stepped one tensor at a time), the triad GB/s measured just before it, and the
    element-wise variant, from the optstep binary. Rates by benchmark: "optstep" (as the engine
    steps), "optstep per tensor"."""
    pattern = f"BM_Triad|BM_AdamW/params:{params}/"
    if params <= 0:
        pattern += f"|BM_AdamWPerTensor/params:{params}/"
    out = subprocess.run(
        [binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}",
         f"--benchmark_filter={pattern}"],
        check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    triad, rates, isa = 0.0, {}, ""
    for b in report["benchmarks"]:
        if b["name"].startswith("BM_Triad"):
            triad = b["GB/s"] if "GB/s" in b else 0.0
        elif b["name"].startswith("BM_AdamWPerTensor"):
            rates["optstep per tensor"] = b["params/s"]
        elif b["name"].startswith("BM_AdamW"):
            rates["optstep"] = b["params/s"]
            isa = b.get("label", isa)
    return rates, triad, isa


def layout(binary):
    out = subprocess.run([binary, "--layout"], check=True, capture_output=True, text=True).stdout
    return [tuple(int(d) for d in line.split()) for line in out.splitlines() if line.strip()]


def make_params(shapes):
    params = []
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        values = (torch.arange(n, dtype=torch.int64) * 2654435761 % 4096).float() / 4096
        p = torch.nn.Parameter(values.reshape(shape).clone())
        p.grad = values.reshape(shape).clone()
        params.append(p)
    return params


def time_steps(step, steps):
    """Median seconds of `steps` calls of step() after two warm-up steps."""
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_rate(shapes, mode, steps):
    params = make_params(shapes)
    kwargs = {"fused": True} if mode == "fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            **kwargs)
    n = sum(p.numel() for p in params)
    return n / time_steps(opt.step, steps)


def deepspeed_rate(shapes, steps):
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # JIT-builds its C++ op on first use
    params = make_params(shapes)
    opt = DeepSpeedCPUAdam(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                           adamw_mode=True)
    n = sum(p.numel() for p in params)
    return n / time_steps(opt.step, steps)


def measure_round(args, shapes, params):
    """One round of a case: optstep right after its triad, then every reference. Rates by name,
    the triad's GB/s and optstep's element-wise variant."""
    rates, triad, isa = optstep_run(args.optstep_bin, args.min_time, params)
    rates["torch fused"] = torch_rate(shapes, "fused", args.steps)
    rates["torch foreach"] = torch_rate(shapes, "foreach", args.steps)
    if not args.no_deepspeed:
        rates["DeepSpeedCPUAdam"] = deepspeed_rate(shapes, args.steps)
    return rates, triad, isa


def ratio_cell(values):
    """The median of per-round ratios, with their range when there are several."""
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.2f}"
    return f"{median:.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optstep_bin", required=True, help="path of //bench:adamw_compare")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per case (median)")
    parser.add_argument("--min_time", default="1.0", help="optstep's --benchmark_min_time")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per case (optstep, then the references); medians reported")
    parser.add_argument("--no_deepspeed", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(os.cpu_count())
    print(f"torch {torch.__version__}, {os.cpu_count()} threads, {args.rounds} rounds, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}", flush=True)
    # case: (shapes, the optstep binary's params argument)
    cases = {"16M": ([(16 * M,)], 16 * M), "64M": ([(64 * M,)], 64 * M),
             "GPT-2 124M layout": (layout(args.optstep_bin), 0),
             "2048 x 16K tensors": ([(16384,)] * 2048, -1)}
    header = ("case", "optimizer", "G params/s", "optstep ratio (range)", "of triad")
    rows = []
    for case, (shapes, params) in cases.items():
        # Each round: optstep right after its own triad, then the references, so that a shared
        # machine's load hits all alike; the medians over the rounds are reported.
        rounds = []
        for r in range(args.rounds):
            rates, triad, isa = measure_round(args, shapes, params)
            print(f"{case}, round {r + 1}: optstep {isa}, triad {triad:.2f} GB/s, " +
                  ", ".join(f"{name} {rate / 1e9:.3f}" for name, rate in rates.items()),
                  flush=True)
            rounds.append((rates, triad))
        triad = statistics.median(t for _, t in rounds)
        for name in rounds[0][0]:
            rate = statistics.median(rates[name] for rates, _ in rounds)
            ratio = ("" if name.startswith("optstep") else
                     ratio_cell([rates["optstep"] / rates[name] for rates, _ in rounds]))
            share = rate * BYTES_PER_PARAM / 1e9 / triad if triad > 0 else float("nan")
            rows.append((case, name, f"{rate / 1e9:.3f}", ratio, f"{share:.2f}"))
        for mine in ("optstep", "optstep per tensor"):
            if mine not in rounds[0][0]:
                continue
            ratios = [rates[mine] / max(rate for name, rate in rates.items()
                                        if name in ("torch fused", "DeepSpeedCPUAdam"))
                      for rates, _ in rounds]
            rows.append((case, f"{mine} / faster of fused and DeepSpeed", "",
                         ratio_cell(ratios), ""))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
