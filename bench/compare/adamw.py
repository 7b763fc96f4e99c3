#!/usr/bin/env python3
"""AdamW on the CPU: optstep against torch (fused, foreach) and DeepSpeedCPUAdam, in one run.

Cases: one fp32 tensor of 16M and of 64M parameters, and the GPT-2-small layout (124M parameters
in 148 tensors, as bench/gpt_layout.cc defines it), which optstep steps in batches of tensors as
its engine does ("optstep") and, for comparison, one tensor at a time ("optstep per tensor").
Every optimizer steps the same sizes with lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay
0.01 (decoupled), on all cores. optstep's figures and the streaming triad come from
//bench:adamw_compare (Google Benchmark, JSON).

    bench/compare/adamw.sh              # makes the venv (bench/compare/venv.sh) and runs this

Prints params/s per optimizer and case, the ratios optstep / reference, and each optimizer's
bus bandwidth (28 B a parameter) over the streaming triad's.
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
    """optstep's params/s on one case (`params` elements; 0 = the layout, also stepped one tensor
    at a time), the triad GB/s measured just before it, and the element-wise variant, from the
    optstep binary. Rates by benchmark: "optstep" (as the engine steps), "optstep per tensor"."""
    pattern = f"BM_Triad|BM_AdamW/params:{params}/"
    if params == 0:
        pattern += "|BM_AdamWPerTensor/params:0/"
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optstep_bin", required=True, help="path of //bench:adamw_compare")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per case (median)")
    parser.add_argument("--min_time", default="1.0", help="optstep's --benchmark_min_time")
    parser.add_argument("--no_deepspeed", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(os.cpu_count())
    print(f"torch {torch.__version__}, {os.cpu_count()} threads", flush=True)
    # case: (shapes, the optstep binary's params argument)
    cases = {"16M": ([(16 * M,)], 16 * M), "64M": ([(64 * M,)], 64 * M),
             "GPT-2 124M layout": (layout(args.optstep_bin), 0)}
    header = ("case", "optimizer", "G params/s", "optstep ratio", "of triad")
    rows = []
    for case, (shapes, params) in cases.items():
        # Each case right after its own triad, so that a shared machine's load hits all alike.
        rates, triad, isa = optstep_run(args.optstep_bin, args.min_time, params)
        print(f"{case}: optstep element-wise kernels {isa}, streaming triad {triad:.2f} GB/s",
              flush=True)
        rates["torch fused"] = torch_rate(shapes, "fused", args.steps)
        rates["torch foreach"] = torch_rate(shapes, "foreach", args.steps)
        if not args.no_deepspeed:
            rates["DeepSpeedCPUAdam"] = deepspeed_rate(shapes, args.steps)
        for name, rate in rates.items():
            ratio = "" if name.startswith("optstep") else f"{rates['optstep'] / rate:.2f}"
            share = rate * BYTES_PER_PARAM / 1e9 / triad if triad > 0 else float("nan")
            rows.append((case, name, f"{rate / 1e9:.3f}", ratio, f"{share:.2f}"))
        best = max(rate for name, rate in rates.items() if name in ("torch fused", "DeepSpeedCPUAdam"))
        rows.append((case, "optstep / faster of fused and DeepSpeed", "",
                     f"{rates['optstep'] / best:.2f}", ""))
        if "optstep per tensor" in rates:
            rows.append((case, "optstep per tensor / faster of fused and DeepSpeed", "",
                         f"{rates['optstep per tensor'] / best:.2f}", ""))
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
